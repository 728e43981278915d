#!/usr/bin/env bash
# Session 22: kind 10 (gathered varlen-K) on a 256 x 128 tile for dW2 (config 8: A' by TMA on the
# 256-wide side, dO's gathered rows on the 128-wide side, re-read by half as many M blocks), its
# tail rows zeroed with 16-byte stores, and per-entry fused_gather / wgrad_gather switches
# (fused_gather="dh", wgrad_gather="dw2": no scatter of dO). GPU tests of kind 10 (incl. the
# long_groups case) and of the layer with each switch; CUPTI medians of dW1 / dW2 per schedule
# at two shapes; the step per kernel at the 120B configs with and without the dO path fused.
#   run(command="bash scripts/h200_s22.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py \
  -k "gathered_varlen_k or (layer_forward_backward and (wgrad or gathers_fused))"
wgrad_times 100 "${TIME_VARIANTS:-gather,tile128x256,plain}" \
  ${TIME_CONFIGS:-32768,4096,1024,128,8 40960,768,256,128,8}
PROF_TAG=ffi kernel_profile "${PROF_S:-170}" "${PROF_CONFIGS:-paper-120B-n1024,paper-120B-n512}" \
  "${PROF_VARIANTS:-ffi,ffi:fused-gather=dh:wgrad-gather=dw2,ffi:wgrad-gather=dw2}" 0.05
echo "== [$(since) s] done"
