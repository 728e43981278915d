#!/usr/bin/env bash
# Session 22, second call: Nsight Compute of the weight-gradient GEMMs at the 120B-n1024 shape
# (kind 10 dW1 on 128 x 256, dW2 on 256 x 128, and CUTLASS's varlen-K GEMM on pre-gathered rows),
# then the step per kernel at the n = 256 configs with the gathers fused per entry point.
#   run(command="bash scripts/h200_s22b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22b_out}
begin_call
cfg=${NCU_CONFIG:-32768,4096,1024,128,8}
echo "== [$(since) s] ncu $cfg"
timeout "${NCU_S:-150}" ncu --clock-control none --set full -k "regex:gather_wgrad|device_kernel" \
  --launch-count 4 --page details --print-units base \
  $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 1 --variants gather,plain \
  > "$OUT/ncu-${cfg//,/_}.txt" 2>&1
grep -E "gather_wgrad_kernel|device_kernel|^    Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |rel\(" \
  "$OUT/ncu-${cfg//,/_}.txt" | cut -c1-160 | head -70
PROF_TAG=ffi-n256 kernel_profile "${PROF_S:-240}" "${PROF_CONFIGS:-paper-1.4B-n256,paper-7B-n256}" \
  "${PROF_VARIANTS:-ffi,ffi:fused-gather=dh:wgrad-gather=dw2,ffi:wgrad-gather,ffi:fused-gather:wgrad-gather}" 0.05
echo "== [$(since) s] done"
