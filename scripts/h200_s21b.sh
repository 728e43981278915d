#!/usr/bin/env bash
# Session 21, second call: why the gathered varlen-K kernel (kind 10) is 3-6x slower than
# scatter + CUTLASS's varlen-K GEMM even with its row lookups one K block ahead (call 1).
# 1. CUPTI medians of dW1 / dW2 at two shapes: kind 10 gathering (gather), CUTLASS on
#    pre-gathered rows (plain), kind 10 on the pre-gathered rows without an index (inorder:
#    the gather's cost against the kernel's), kind 10 with both operands by cp.async (coop);
# 2. Nsight Compute (full set) on the gather / plain / inorder kernels of the first shape;
# 3. on an H200 only (the original SonicMoE's rows were measured on one), the ffi layer
#    benchmark of the two presets furthest from 1.1x of it (rows still session 12's).
#   run(command="bash scripts/h200_s21b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s21b_out}
CONFIGS=${NCU_CONFIGS:-40960,768,256,128,8 32768,4096,256,256,16}
begin_call
for cfg in $CONFIGS; do
  echo "== [$(since) s] times $cfg"
  timeout 150 $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 2 --time \
    --variants gather,plain,inorder,coop > "$OUT/times-${cfg//,/_}.txt" 2>&1
  tail -14 "$OUT/times-${cfg//,/_}.txt"
done
for cfg in ${CONFIGS%% *}; do
  tag=${cfg//,/_}
  echo "== [$(since) s] ncu $cfg"
  timeout "${NCU_S:-150}" ncu --clock-control none --set full -k "regex:gather_wgrad|device_kernel" \
    --launch-count 6 --page details --print-units base \
    $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 1 --variants gather,plain,inorder \
    > "$OUT/ncu-$tag.txt" 2>&1
  grep -E "gather_wgrad_kernel|device_kernel|^    Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|rel\(" \
    "$OUT/ncu-$tag.txt" | cut -c1-160 | head -70
done
if [[ ${BENCH:-1} == 1 ]] && grep -q H200 "$OUT/gpu.txt"; then
  BACKENDS=ffi layer_bench "${TOTAL_S:-450}" s21-ffi-presets DeepSeek-V3-like Mixtral-8x7B
fi
echo "== [$(since) s] done"
