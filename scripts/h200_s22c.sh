#!/usr/bin/env bash
# Session 22, third call: kind 10's producer with precomputed shared-memory destinations and
# 32-bit staged row offsets in 16-byte units (~10 instructions per cp.async instead of ~30).
# GPU tests of kind 10 and the layer with the gathers fused per entry point, CUPTI medians of
# dW1 / dW2 alone at three shapes, the step per kernel at four configs, memcheck of kind 10.
#   run(command="bash scripts/h200_s22c.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22c_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py \
  -k "gathered_varlen_k or (layer_forward_backward and (wgrad or gathers_fused))"
wgrad_times 100 "${TIME_VARIANTS:-gather,plain}" \
  ${TIME_CONFIGS:-32768,4096,1024,128,8 40960,768,256,128,8 32768,4096,256,256,16}
PROF_TAG=ffi kernel_profile "${PROF_S:-200}" \
  "${PROF_CONFIGS:-paper-120B-n1024,paper-120B-n512,paper-1.4B-n256,paper-7B-n256}" \
  "${PROF_VARIANTS:-ffi,ffi:fused-gather=dh:wgrad-gather=dw2,ffi:fused-gather:wgrad-gather}" 0.05
memcheck "${MC_S:-120}" tests/test_ffi.py \
  -k "gathered_varlen_k and (topk or empty or token_rounding or long_groups)"
echo "== [$(since) s] done"
