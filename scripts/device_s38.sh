#!/usr/bin/env bash
# Session 38's device calls; no device was lent in session 38, so none has run yet. Carry the
# built library (ABI 15, csrc unchanged since 8f3d141):
#   run(command="PART=autobench,mix512 bash scripts/device_s38.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"], kind="nvidia-h200")
# autobench: scripts/device_s37.sh's part (auto's GPU test, then the layer benchmark of pallas,
#   ffi and pallas+ffi at the n = 256 paper configs), for the README's H200 table.
# mix512 / mix1024: which backend runs each entry point where n >= 512, where auto runs ffi
#   (mix512 first runs the GPU layer test of pallas+ffi-wgrad's mix against xla, top-K and
#   token rounding; ~500 s with autobench in one call).
#   The session-37 profiles (H100, 120B-n512) had pallas ahead on up_proj (7.20 against
#   scatter 1.68 + 6.80 + SwiGLU 0.52 ms) and on dh (5.13 in one kernel against scatter 1.67 +
#   3.64 + dSwiGLU 1.25), ffi ahead on dW2 (3.65 against 5.50) and dW1 (7.74 against 8.92).
#   Variants, interleaved in one process (kernel ms of the step, errors against the first):
#   - ffi: what auto runs there now;
#   - ffi:wgrad-gather=dw1: ffi with dW1 through gather_idx (session 37's dw1gather question:
#     no (T·K, d) copy of x kept for dW1);
#   - pallas+ffi: the combined backend (ffi's dW1 then scatters x in the backward);
#   - pallas+dh/dw2/dx_pairs=ffi+dw1=ffi:wgrad-gather=dw1: that, dW1 through gather_idx;
#   - pallas+ffi-wgrad (backends.COMBINED, = pallas+dw2/dx_pairs/dw1=ffi:wgrad-gather=both):
#     pallas' dh too (dO gathered in its kernel), so dW2 reads dO through gather_idx and no row
#     of x or dO is ever scattered.
# mix256: the same question where auto runs pallas+ffi (n <= 256, where ffi's defaults already
#   read x and dO through gather_idx in dh, dW1 and dW2): pallas+ffi against pallas' dh in it.
# benchwgrad: the layer benchmark of pallas+ffi-wgrad, ffi and pallas at the n = 512 configs.
# mem: the compiled step's memory of those variants (benchmarks/memory_report.py).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s38_out}
MIX_VARIANTS="ffi,ffi:wgrad-gather=dw1,pallas+ffi,pallas+dh/dw2/dx_pairs=ffi+dw1=ffi:wgrad-gather=dw1,pallas+ffi-wgrad"
begin_call
for part in ${PART//,/ }; do
case $part in
autobench)
  auto_bench "${TEST_S:-150}" "${BENCH_S:-200}" s38-autobench \
    ${BENCH_CONFIGS:-paper-1.4B-n256 paper-7B-n256 paper-30B-n256}
  ;;
mix512)
  TESTS_TAG=mix512 gpu_tests "${TEST_S:-90}" tests/test_ffi.py \
    -k "layer_forward_backward_matches_xla and mixed_pallas_dh_ffi_wgrad"
  PROF_TAG=mix512 kernel_profile "${PROF_S:-300}" \
    "${PROF_CONFIGS:-paper-7B-n512,paper-30B-n512,paper-120B-n512}" "$MIX_VARIANTS" 0.05
  ;;
mix1024)
  # + pallas+ffi-wgrad with pallas' dh gathering dO in its kernel: at n >= 1024 (and n = 512
  # below d = 4096) pallas' backward_gathers="auto" gives dh a dispatched (T·K, d) copy of dO,
  # which it shares with pallas' dW2 in the pallas step, but here only dh reads.
  PROF_TAG=mix1024 kernel_profile "${PROF_S:-330}" \
    "${PROF_CONFIGS:-paper-1.4B-n1024,paper-30B-n1024,paper-120B-n1024}" \
    "$MIX_VARIANTS,pallas:fused+dw2/dx_pairs/dw1=ffi:wgrad-gather=both" 0.05
  ;;
mix256)
  PROF_TAG=mix256 kernel_profile "${PROF_S:-300}" \
    "${PROF_CONFIGS:-paper-1.4B-n256,paper-7B-n256,paper-30B-n256}" \
    "pallas+ffi,pallas+ffi-wgrad,ffi,pallas" 0.05
  ;;
benchwgrad)
  # The layer benchmark (H200: rows for the README's table) of pallas+ffi-wgrad against ffi and
  # pallas where n >= 512; run it once mix512 / mix1024 show the mix ahead.
  BACKENDS=${BACKENDS:-ffi,pallas,pallas+ffi-wgrad} layer_bench "${BENCH_S:-560}" s38-wgrad \
    ${BENCH_CONFIGS:-paper-120B-n512 paper-30B-n512 paper-7B-n512 paper-1.4B-n512}
  ;;
mem)
  memory_report "${MEM_S:-200}" 8 "${MEM_CONFIGS:-paper-120B-n1024,paper-120B-n512}" \
    "${MEM_VARIANTS:-$MIX_VARIANTS}"
  ;;
*)
  echo "unknown part $part"
  ;;
esac
done
echo "== [$(since) s] done"
