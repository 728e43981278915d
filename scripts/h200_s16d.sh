#!/usr/bin/env bash
# Prepared in session 16, not run yet (its device call lost the machine): the ffi backend's
# warp-per-row dSwiGLU kernel (FfiKernels(dswiglu="warp"), ops.dswiglu(warp_per_row=True)).
#   1. GPU tests: the warp kernel against the block kernel (dH, A' bit for bit; dS) and a
#      float64 reference, the backward entry points, the layer for every FfiKernels variant
#      (dswiglu="warp" included), the fused epilogues (re-run after session 16's refactors);
#   2. per-kernel profile of the layer step, dswiglu "block" against "warp", at n = 256 and
#      n = 512 configs;
#   3. the layer benchmark of the ffi backend (its defaults) on all 16 configs, time permitting.
# If the tests pass and "warp" is faster, make it FfiKernels' default and rerun the layer bench.
# Build the library first on the CPU machine (ABI 6), then
#   run(command="bash scripts/h200_s16d.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s16d_out}
begin_call
gpu_tests "${TEST_S:-180}" tests/test_ffi.py -k "dswiglu or backward_entry or layer_forward_backward or fused_epilogue"
PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-150}" \
  "paper-1.4B-n256,paper-7B-n256,paper-30B-n256,paper-120B-n512" "ffi,ffi:dswiglu=warp" 0.05
BACKENDS=ffi layer_bench "${TOTAL_S:-565}" s16-ffi paper-1.4B-n256 paper-7B-n256 paper-30B-n256 \
  paper-1.4B-n512 paper-7B-n512 paper-30B-n512 paper-120B-n512 paper-1.4B-n1024 paper-7B-n1024 \
  paper-30B-n1024 paper-120B-n1024 paper-120B-n2048 qwen3-30b-a3b olmoe-1b-7b mixtral-8x7b \
  deepseek-v3-like
echo "== [$(since) s] done"
