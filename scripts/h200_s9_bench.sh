#!/usr/bin/env bash
# Session 9, device call 1: the layer with dH written over H in place and the slimmer dW1 barrier.
#   1. the marked GPU tests of dH and the layer gradients (float32 reference);
#   2. benchmarks/memory_report.py (compile only) at MEM_CONFIGS, the configs where pallas held
#      more than the original SonicMoE in session 8;
#   3. pallas_forward.py --train-mixes: default against dw1-early (no barrier) at MIX_CONFIGS;
#   4. the layer benchmark of the pallas backend on the 12 paper configs and 4 presets.
#   run(command="bash scripts/h200_s9_bench.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_bench_out}
mkdir -p "$OUT/mem" "$OUT/mixes"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] GPU tests"
timeout "${TEST_S:-120}" $PY -m pytest -q -rA -m gpu tests/test_pallas_backward.py \
  -k "gpu_layer_gradients or gpu_dh" > "$OUT/gpu-tests.log" 2>&1
tail -n 8 "$OUT/gpu-tests.log"

echo "== [$(since) s] memory report"
timeout "${MEM_S:-75}" $PY benchmarks/memory_report.py --out-dir "$OUT/mem" --rows 10 \
  --configs "${MEM_CONFIGS:-paper-1.4B-n512,paper-1.4B-n1024,mixtral-8x7b}" \
  --variants pallas > "$OUT/mem/report.log" 2>&1
grep -E "^== |^ +[0-9.]+[MG]iB\( *[0-9]+%\)" "$OUT/mem/report.log" | cut -c1-150 | head -n 40
grep -E "Error" "$OUT/mem/report.log" | head -5

echo "== [$(since) s] --train-mixes (default, dw1-early, default-again)"
timeout "${MIX_S:-70}" $PY benchmarks/pallas_forward.py --out-dir "$OUT/mixes" \
  --configs "${MIX_CONFIGS:-1.4B-512,7B-512}" --parts train --train-mixes \
  --train-only default,dw1-early,default-again --skip-check --skip-baselines --iters 5 \
  > "$OUT/mixes/run.log" 2>&1
grep -E "^==|train\[" "$OUT/mixes/run.log" | tail -n 12 | cut -c1-200

left=$(( ${TOTAL_S:-585} - $(since) ))
echo "== [$(since) s] layer benchmark, ${left} s"
WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
  BENCH_ARGS="--configs paper presets --backends pallas --baselines none --warmup 1 --iters 5 --no-check --no-plots --tag ${BENCH_TAG:-pallas-s9}" \
  bash benchmarks/run_h200.sh 2>&1 | tail -n 22
echo "== [$(since) s] done"
