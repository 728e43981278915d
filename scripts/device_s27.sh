#!/usr/bin/env bash
# Next device calls (prepared in session 27, whose H200 attempts got no machine; carry the
# built library). Session 27's H100 calls are in benchmarks/results/s27-h100-2026-12-06.md.
# PART=bench (an H200 only: the README table's rows are H200 rows): the layer benchmark of
#   pallas and ffi through moe_top_k (session 26's path, which no H200 has run) at the configs
#   that miss a target in the README (BENCH_CONFIGS; DeepSeek-V3-like needs the H200's memory).
#   Then, on the CPU machine: copy $OUT/bench-*.json to benchmarks/results/ and
#     python -m sonic_jax.bench.merge benchmarks/results/bench-h200-<date>-merged.json \
#       benchmarks/results/bench-h200-<date>-s27.json \
#       --extend benchmarks/results/bench-h200-2026-12-05-merged.json --note ...
#     python -m sonic_jax.bench.readme
# PART=mix: ffi's dh (CUTLASS GEMM to fp32 dA' + the dSwiGLU kernel: 0.328 + 0.390 ms at
#   1.4B-n512 on the H100) against pallas' dh with the epilogue fused (0.629 ms) and ffi's own
#   fused epilogue, in the ffi step: if ffi+dh=pallas wins at small d, backend='auto' can run
#   that mix there.
# PART=tests: the Pallas layer gradients against the float32 reference at real sizes (the
#   router's weight gradient now comes from the same dl as its dx, d82dad1) and the router's
#   mean-probability gradients on the GPU.
#   run(command="PART=tests,mix bash scripts/device_s27.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s27_out}
begin_call
PART=${PART:-tests,mix}
for part in ${PART//,/ }; do
case $part in
tests)
  layer_gradient_tests "${TEST_S:-150}"
  ;;
bench)
  h200_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s27}"
  ;;
mix)
  PROF_TAG=mix kernel_profile "${PROF_S:-300}" "${MIX_CONFIGS:-paper-1.4B-n512,paper-7B-n256}" \
    "${MIX_VARIANTS:-ffi,ffi+dh=pallas,ffi:fused_epilogue=dh,pallas}" 0.05
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
