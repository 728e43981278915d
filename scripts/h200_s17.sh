#!/usr/bin/env bash
# Prepared in session 17 (no device was lent that session), ABI 7: the ffi backend's
#   * two new schedules of the in-GEMM gather kernels (FfiKernels(gather_schedule=...)):
#     "noinc" (GemmConfig 7: stages published by cp.async.mbarrier.arrive.noinc, so the producer
#     never waits for its own copies) and "tma_b" (GemmConfig 6: noinc, and the weights by TMA
#     multicast over a 2 x 1 cluster);
#   * warp-per-row dSwiGLU kernel of session 16 (FfiKernels(dswiglu="warp")), never run yet.
# 1. GPU tests: the gathered GEMMs and the fused epilogues under all four schedules (float64
#    reference, the unfused kernels, determinism, no live rows), the warp dSwiGLU against the
#    block one, the backward entry points, the layer for every FfiKernels variant (the new
#    schedules and the warp dSwiGLU included), the host layout checks;
# 2. `sonic_jax.ffi.sweep --fused-gather-only` at 120B-n1024: the gathered up_proj / dh GEMMs
#    under configs 4-7 against gather_rows + the TMA GEMM, and the layer with fused_gather under
#    each gather_schedule.
# Build the library on the CPU machine first (python -m sonic_jax.ffi.build), then
#   run(command="bash scripts/h200_s17.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# Call 2 is scripts/h200_s17b.sh.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s17_out}
begin_call
gpu_tests "${TEST_S:-400}" tests/test_ffi.py -k "${TEST_K:-gathered or fused_gather or fused_epilogue or dswiglu or backward_entry or layer_forward_backward or layout}"
ffi_sweep "${SWEEP_S:-150}" fused-gather-sweep "config T=|fused|gather_rows|layer" \
  --fused-gather-only --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8}
echo "== [$(since) s] done"
