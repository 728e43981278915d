#!/usr/bin/env bash
# Session 22, fourth call: FfiKernels' new default (fused_gather / wgrad_gather "auto": dh and
# dW2 read dO through gather_idx where n <= 256). Layer GPU tests of the gather switches, Nsight
# Compute of kind 10 after the producer rewrite (120B-n1024 shape), and the step per kernel at
# the n = 256 / 512 configs not profiled yet: the default against the old one (no in-GEMM
# gathers) and against the dO path in the GEMM at n = 512.
#   run(command="bash scripts/h200_s22d.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22d_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_ffi.py \
  -k "(layer_forward_backward and (gather or wgrad)) or scatter_rows_match or dw1_last_match"
wgrad_ncu "${NCU_S:-120}" "${NCU_CONFIG:-32768,4096,1024,128,8}" gather,plain 4
PROF_TAG=ffi kernel_profile "${PROF_S:-240}" \
  "${PROF_CONFIGS:-paper-30B-n256,paper-1.4B-n512,paper-7B-n512,paper-30B-n512}" \
  "${PROF_VARIANTS:-ffi,ffi:fused-gather=none:wgrad-gather=none,ffi:fused-gather=dh:wgrad-gather=dw2}" 0.05
echo "== [$(since) s] done"
