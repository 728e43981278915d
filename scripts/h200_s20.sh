#!/usr/bin/env bash
# Session 20, one call for what sessions 19-20 could not run (device starts kept failing, so
# scripts/h200_s19.sh and h200_s19b.sh are cut to their essentials; carry the built library):
# 1. GPU tests: the gathered varlen-K kernel (kind 10) against float64 and the layer
#    forward+backward of every ffi / mixed variant against xla;
# 2. per-kernel profile of the ffi step (variants interleaved) at the n = 256 configs furthest
#    below 1.1x the original and at 120B-n1024: dSwiGLU warp per row, the gathered weight
#    gradients alone and with the fused gather;
# 3. compute-sanitizer memcheck of kind 10 and the cooperative varlen-M schedules.
#   run(command="bash scripts/h200_s20.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s20_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_ffi.py -k "gathered_varlen_k or layer_forward_backward"
PROF_TAG=ffi kernel_profile "${PROF_S:-210}" \
  "paper-30B-n256,paper-120B-n1024,paper-1.4B-n256" \
  "ffi,ffi:dswiglu=warp,ffi:wgrad-gather,ffi:fused-gather:wgrad-gather:dswiglu=warp" 0.05
memcheck "${MC_S:-100}" tests/test_ffi.py \
  -k "(gathered_varlen_k and (topk or ragged or empty)) or (every_gemm_schedule and COOPERATIVE)"
echo "== [$(since) s] done"
