#!/usr/bin/env bash
# Session 22, second call: Nsight Compute of the weight-gradient GEMMs at the 120B-n1024 shape
# (kind 10 dW1 on 128 x 256, dW2 on 256 x 128, and CUTLASS's varlen-K GEMM on pre-gathered rows),
# then the step per kernel at the n = 256 configs with the gathers fused per entry point.
#   run(command="bash scripts/h200_s22b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22b_out}
begin_call
wgrad_ncu "${NCU_S:-150}" "${NCU_CONFIG:-32768,4096,1024,128,8}" gather,plain 4
PROF_TAG=ffi-n256 kernel_profile "${PROF_S:-240}" "${PROF_CONFIGS:-paper-1.4B-n256,paper-7B-n256}" \
  "${PROF_VARIANTS:-ffi,ffi:fused-gather=dh:wgrad-gather=dw2,ffi:wgrad-gather,ffi:fused-gather:wgrad-gather}" 0.05
echo "== [$(since) s] done"
