#!/usr/bin/env bash
# Session 16, device call 4 (lost its machine before it ran; run it in a later session): the ffi
# backend after the warp-per-row dSwiGLU kernel, which is on the branch ffi-dswiglu-warp-per-row
# (merge it, rebuild the library, run this; keep the merge if the tests pass and dswiglu is faster).
#   1. GPU tests: the backward entry points (dswiglu against xla), the layer for every
#      FfiKernels variant, the fused epilogues;
#   2. per-kernel profile, fused_epilogue "none" against "dh", at two n = 256 configs;
#   3. the layer benchmark of the ffi backend on all 16 configs with the time left.
#   run(command="bash scripts/h200_s16d.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s16d_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "backward_entry or layer_forward_backward or fused_epilogue"
PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-120}" "paper-1.4B-n256,paper-30B-n256" \
  "ffi:fused_epilogue=none,ffi:fused_epilogue=dh" 0.05
BACKENDS=ffi layer_bench "${TOTAL_S:-565}" s16-ffi paper-1.4B-n256 paper-7B-n256 paper-30B-n256 \
  paper-1.4B-n512 paper-7B-n512 paper-30B-n512 paper-120B-n512 paper-1.4B-n1024 paper-7B-n1024 \
  paper-30B-n1024 paper-120B-n1024 paper-120B-n2048 qwen3-30b-a3b olmoe-1b-7b mixtral-8x7b \
  deepseek-v3-like
echo "== [$(since) s] done"
