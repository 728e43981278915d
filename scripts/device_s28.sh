#!/usr/bin/env bash
# Session 28's device calls (carry the built library, ABI 14 since session 29:
#   sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=bench (an H200 only; the README table's rows are H200 rows): as scripts/device_s27.sh's
#   bench part (the layer benchmark of pallas and ffi through moe_top_k at the configs that miss
#   a target; merge and readme steps in that script's header).
# PART=sweep (any Hopper GPU): `python -m sonic_jax.ffi.sweep --gemms-only` at 120B-n1024 and
#   30B-n512 (T=32768, d=4096, E=128, K=8): the six plain grouped GEMMs under every instantiated
#   schedule (session 28's: 128x256 over a 2x2 cluster, 128x256 without a cluster, ping-pong
#   64x256 for varlen-M bf16; no cluster for dh's fp32 kind and varlen-K bf16, not yet timed)
#   next to XLA's dense matmul, then the layer step with the default and the swept table.
#   Session 28 ran it on an H100 (benchmarks/results/s28-h100-2026-12-06.md).
# PART=prof (any Hopper GPU): kernel profile of the ffi step with the new default schedules
#   against ffi with the old ones (FfiKernels(schedules=...)), variants interleaved.
# PART=gather (any Hopper GPU): the in-GEMM gather schedule without a cluster (GATHER_TMA_B_128x256_C1,
#   gather_schedule="tma_b_c1"): its GPU tests and the --fused-gather-only sweep.
# PART=tests: as device_s27.sh's (Pallas layer gradients, route mean-probs), plus the ffi GEMM
#   tests of every instantiated schedule (the new ones included).
#   run(command="PART=sweep,tests bash scripts/device_s28.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s28_out}
begin_call
PART=${PART:-sweep,tests}
for part in ${PART//,/ }; do
case $part in
sweep)
  ffi_sweep "${SWEEP_S:-240}" sweep "^config|  (down_proj|up_proj|dh|dx_pairs|dw1|dw2|layer)|MEASURED" \
    --gemms-only --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 32768,4096,512,128,8}
  ;;
tests)
  gpu_tests "${TEST_S:-200}" tests/test_ffi.py -k "every_gemm_schedule"
  cp "$OUT/gpu-tests.log" "$OUT/gpu-tests-ffi.log"
  layer_gradient_tests "${TEST_S:-150}"
  ;;
bench)
  h200_bench "${TOTAL_S:-530}" "${BENCH_TAG:-s28}"
  ;;
prof)
  # The ffi step with the new varlen-M defaults (no cluster) against the old ones (2 x 1).
  OLD=schedule=VARLEN_M_NN_BF16@COOPERATIVE_128x256_C2x1:schedule=VARLEN_M_NT_BF16@COOPERATIVE_128x256_C2x1
  PROF_TAG=sched kernel_profile "${PROF_S:-400}" \
    "${PROF_CONFIGS:-paper-120B-n1024,paper-7B-n256,paper-1.4B-n512,paper-30B-n512}" "ffi,ffi:$OLD" 0.05
  ;;
gather)
  # The in-GEMM gather kinds' schedule without the cluster (config 13, not yet run on a GPU):
  # its GPU tests, then the fused-gather sweep (each gather schedule against gather_rows + GEMM,
  # and the layer under each gather_schedule) at 120B-n1024 and 7B-n256.
  gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "TMA_B_128x256_C1 or tma_b_c1"
  ffi_sweep "${SWEEP_S:-240}" gather-sweep "^config|fused|layer" --fused-gather-only \
    --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 24576,1536,256,128,8}
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
