#!/usr/bin/env bash
# Session 23, first call (prepared in session 22): kind 10's config 9 (GATHER_TMA_256x128_C1, the
# 256 x 128 TMA schedule without the 2-CTA cluster) against config 8. GPU tests of kind 10 (every
# schedule), dW2 alone per schedule at three shapes, the step at 120B-n1024 with the dO path in
# the GEMM on each (variant ffi:fused-gather=dh:wgrad-gather=dw2 uses the default, config 8).
#   run(command="bash scripts/h200_s23.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s23_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_ffi.py -k "gathered_varlen_k"
wgrad_times 80 "${TIME_VARIANTS:-gather,nocluster,plain}" \
  ${TIME_CONFIGS:-32768,4096,1024,128,8 32768,4096,256,256,16 40960,768,256,128,8}
memcheck "${MC_S:-120}" tests/test_ffi.py -k "gathered_varlen_k and C1"
echo "== [$(since) s] done"
