#!/usr/bin/env bash
# Prepared in session 17, call 2 after scripts/h200_s17.sh (whose tests must pass first):
# 1. per-kernel profile of the layer step, dswiglu "block" against "warp" (session 16's warp
#    kernel), at three configs;
# 2. `sonic_jax.ffi.sweep --fused-epilogue-only` at 120B-n1024 and 7B-n256: up_proj, dh and
#    the layer with the epilogues separate and both fused under each gather_schedule, and each
#    schedule of the two fused kernels.
# Then make dswiglu="warp" or a gather schedule the default if it is faster, and rerun the ffi
# layer benchmark (BACKENDS=ffi layer_bench, as scripts/h200_s16d.sh does) in a later call.
#   run(command="bash scripts/h200_s17b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s17b_out}
begin_call
PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-150}" \
  "paper-1.4B-n256,paper-7B-n256,paper-120B-n512" "ffi,ffi:dswiglu=warp" 0.05
ffi_sweep "${SWEEP_S:-330}" fused-epilogue-sweep "config T=|\\[" --fused-epilogue-only \
  --epilogue-variants ${EPI_VARIANTS:-both both:noinc both:tma_b} \
  --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 24576,1536,256,128,8}
echo "== [$(since) s] done"
