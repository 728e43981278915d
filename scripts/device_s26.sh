#!/usr/bin/env bash
# Session 26 device call (an H100 or an H200; carry the built library): top-K routing and the
# expert block as one custom_vjp (experts.moe_top_k), the router's x-gradient the addend of the
# experts' dx combine, renormalized scores differentiated without the recomputed router GEMM.
# PART=tests: GPU tests of the router, the Pallas layer gradients and the ffi layer (moe() now
#   runs moe_top_k).
# PART=profile: per-kernel step profile at the two configs 0.988-0.993x the paper (7B-n256,
#   1.4B-n512): moe() against its previous paths (@two-step: route + moe_experts, XLA's add of
#   the router's dx; @recomputed-router: that with the router GEMM and softmax recomputed, the
#   path before this session), pallas and ffi.
# PART=mem: compile-only memory report of the same variants at the configs whose peak is closest
#   to the original SonicMoE's (Qwen3-30B-A3B 0.998x) and 7B-n256: the (T, d) addend is live at
#   the dx combine.
# PART=bench (an H200 only): the layer benchmark of pallas and ffi at BENCH_CONFIGS.
#   run(command="PART=tests,profile,mem bash scripts/device_s26.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s26_out}
begin_call
PART=${PART:-tests,profile,mem}
VARIANTS=${VARIANTS:-pallas,pallas@two-step,pallas@recomputed-router,ffi,ffi@recomputed-router}
for part in ${PART//,/ }; do
case $part in
tests)  # (the first call's wider selection did not finish in 170 s)
  # TEST_FILES / TEST_K narrow it (session 27: the refactored ffi combine handlers).
  gpu_tests "${TEST_S:-230}" ${TEST_FILES:-tests/test_router_top_k.py tests/test_pallas_backward.py \
    tests/test_ffi.py} -k "${TEST_K:-test_gpu_route or test_gpu_layer_gradients_match_float32 or \
(test_layer_forward_backward_matches_xla and topk) or combine_add}"
  tail -n 3 "$OUT/gpu-tests.log" | cut -c1-200
  ;;
bench)  # an H200 only (the README table's rows are H200 rows)
  if grep -q H200 "$OUT/gpu.txt"; then
    BACKENDS=pallas,ffi layer_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s26}" \
      ${BENCH_CONFIGS:-paper-7B-n256 paper-1.4B-n512}
  else
    echo "not an H200: skipped"
  fi
  ;;
profile)
  PROF_TAG=s26 kernel_profile "${PROF_S:-330}" "${PROF_CONFIGS:-paper-7B-n256,paper-1.4B-n512}" \
    "$VARIANTS" 0.015
  ;;
mem)
  memory_report "${MEM_S:-150}" 10 "${MEM_CONFIGS:-Qwen3-30B-A3B,paper-7B-n256}" "$VARIANTS"
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
