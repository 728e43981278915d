#!/usr/bin/env bash
# Session 21, second call: why the gathered varlen-K kernel (kind 10) is 4-7x slower than
# scatter + CUTLASS's varlen-K GEMM even with its row lookups one K block ahead (call 1).
# Nsight Compute on the dW1 / dW2 kernels of both variants at two shapes, then their CUPTI
# medians. Carry the built library:
#   run(command="bash scripts/h200_s21b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s21b_out}
begin_call
for cfg in ${NCU_CONFIGS:-32768,4096,256,256,16 40960,768,256,128,8}; do
  tag=${cfg//,/_}
  echo "== [$(since) s] ncu $cfg"
  timeout "${NCU_S:-200}" ncu --clock-control none --set full -k "regex:gather_wgrad|device_kernel" \
    --launch-count 4 --page details --print-units base \
    $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 1 > "$OUT/ncu-$tag.txt" 2>&1
  grep -E "gather_wgrad_kernel|device_kernel|^    Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|rel\(" \
    "$OUT/ncu-$tag.txt" | cut -c1-160 | head -60
  timeout 120 $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 2 --time 2>&1 | tail -6
done
echo "== [$(since) s] done"
