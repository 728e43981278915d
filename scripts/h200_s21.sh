#!/usr/bin/env bash
# Next device call (prepared in session 20; carry the built library): the gathered varlen-K
# kernel (kind 10) after its producer started looking up the next K block's rows one stage
# ahead (session 20 measured it 3-8x slower than scatter + CUTLASS's varlen-K GEMM):
# 1. its GPU tests against float64 and the layer tests that run it;
# 2. the ffi step per kernel with and without wgrad_gather (and with the fused gather) at the
#    three shapes session 20 measured;
# 3. compute-sanitizer memcheck of the kind-10 tests;
# 4. the ffi layer benchmark of the four preset configs, whose rows are still session 12's
#    (before the warp dSwiGLU default).
#   run(command="PART=kernels bash scripts/h200_s21.sh" (then PART=bench), carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s21_out}
begin_call
# Two calls fit the 600 s limit: PART=kernels (steps 1-3) and PART=bench (step 4).
if [[ ${PART:-kernels} == kernels ]]; then
gpu_tests "${TEST_S:-120}" tests/test_ffi.py \
  -k "gathered_varlen_k or (layer_forward_backward and (wgrad or all_gathers or mixed_pallas_wgrad))"
PROF_TAG=ffi kernel_profile "${PROF_S:-210}" \
  "paper-30B-n256,paper-120B-n1024,paper-1.4B-n256" \
  "ffi,ffi:wgrad-gather,ffi:fused-gather:wgrad-gather" 0.05
memcheck "${MC_S:-100}" tests/test_ffi.py \
  -k "gathered_varlen_k and (topk or empty or token_rounding)"
else
BACKENDS=ffi layer_bench "${TOTAL_S:-540}" "${BENCH_TAG:-s21-ffi-presets}" \
  DeepSeek-V3-like Mixtral-8x7B Qwen3-30B-A3B OLMoE-1B-7B
fi
echo "== [$(since) s] done"
