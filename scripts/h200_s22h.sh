#!/usr/bin/env bash
# Session 22, last call: kind 10's producer reads each K block's staged row offsets before it
# waits for a free stage (Nsight Compute had its copies each waiting on their own shared-memory
# load). Kind-10 GPU tests, dW1 / dW2 alone at two shapes, the step at 120B-n1024 and 1.4B-n256
# with the dO path in the GEMM and without.
#   run(command="bash scripts/h200_s22h.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22h_out}
begin_call
gpu_tests "${TEST_S:-100}" tests/test_ffi.py -k "gathered_varlen_k"
wgrad_times 60 "${TIME_VARIANTS:-gather,plain}" \
  ${TIME_CONFIGS:-32768,4096,1024,128,8 32768,4096,256,256,16}
PROF_TAG=ffi kernel_profile "${PROF_S:-120}" "${PROF_CONFIGS:-paper-120B-n1024,paper-1.4B-n256}" \
  "${PROF_VARIANTS:-ffi:fused-gather=none:wgrad-gather=none,ffi:fused-gather=dh:wgrad-gather=dw2}" 0.05
echo "== [$(since) s] done"
