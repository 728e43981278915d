#!/usr/bin/env bash
# Session 37's device calls beyond scripts/device_s36.sh's parts (which ran in session 37):
#   run(command="PART=autobench bash scripts/device_s37.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"], kind="nvidia-h200")
# autobench: auto's new first choice at n <= 256, "pallas+ffi" (the pallas forward with the ffi
#   backward): the GPU test of auto's choices (forward and gradients against xla), then the layer
#   benchmark of pallas, ffi and pallas+ffi at the n = 256 paper configs. Ran on an H100 in
#   session 37 (call 9). On an H200 its JSON joins the README's table:
#     python -m sonic_jax.bench.merge benchmarks/results/bench-h200-<date>-merged.json \
#       <the run's JSON> --extend benchmarks/results/bench-h200-2026-12-07-merged.json
#     python -m sonic_jax.bench.readme
#   so that the `auto` column scores pallas+ffi where auto runs it (until then it shows pallas).
# dw1gather (any Hopper GPU): at n >= 512, dW1 reading x through gather_idx (the gathered
#   weight-gradient kernel, 2-8 % faster since the whole-sector stores: 6.795 ms against
#   CUTLASS's 7.559 incl. its 0.85 ms gather_rows at 120B-n1024's shape, session 37 call 1)
#   against the default, which keeps the forward's scattered (T·K, d) copy of x alive for dW1:
#   the interleaved step profile, then the compiled step's memory (benchmarks/memory_report.py).
#   If the step is no slower, wgrad_gather's "auto" should put dW1 in the GEMM there too: ffi's
#   step memory would drop by that copy (2 GiB at 120B-n1024), where ffi takes more than pallas
#   (README status).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s37_out}
begin_call
for part in ${PART//,/ }; do
case $part in
autobench)
  auto_bench "${TEST_S:-150}" "${BENCH_S:-330}" s37-autobench \
    ${BENCH_CONFIGS:-paper-1.4B-n256 paper-7B-n256 paper-30B-n256}
  ;;
dw1gather)
  PROF_TAG=dw1gather kernel_profile "${PROF_S:-330}" \
    "${PROF_CONFIGS:-paper-120B-n1024,paper-30B-n1024,paper-7B-n1024,paper-1.4B-n1024,paper-120B-n512}" \
    "ffi,ffi:wgrad-gather=dw1" 0.05
  memory_report "${MEM_S:-200}" 8 \
    "${MEM_CONFIGS:-paper-120B-n1024,paper-30B-n1024,paper-120B-n512}" "ffi,ffi:wgrad-gather=dw1"
  ;;
*)
  echo "unknown part $part"
  ;;
esac
done
echo "== [$(since) s] done"
