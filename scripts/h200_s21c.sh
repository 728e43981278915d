#!/usr/bin/env bash
# Session 21, third call: kind 10 with its rows staged in shared memory per 1024-row chunk
# (the next chunk loaded while the current one is copied; Nsight Compute had shown the producer
# waiting on its per-stage index loads 80 % of the time). GPU tests of kind 10 and the layer
# with it, CUPTI medians of dW1 / dW2 (gather / plain / inorder) at two shapes, and the step per
# kernel at 120B-n1024 with and without the gathered weight gradients.
#   run(command="bash scripts/h200_s21c.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s21c_out}
begin_call
gpu_tests "${TEST_S:-90}" tests/test_ffi.py \
  -k "gathered_varlen_k or (layer_forward_backward and (wgrad or all_gathers))"
wgrad_times 100 "gather,plain,inorder" 40960,768,256,128,8 32768,4096,256,256,16
PROF_TAG=ffi kernel_profile "${PROF_S:-120}" "paper-120B-n1024,paper-7B-n256" \
  "ffi,ffi:fused-gather:wgrad-gather" 0.05
echo "== [$(since) s] done"
