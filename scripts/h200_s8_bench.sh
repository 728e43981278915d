#!/usr/bin/env bash
# Session 8, device call 2: the layer with dW1 behind an optimization barrier (ExpertKernels.
# dw1_last; PallasKernels default), logs straight into $OUT:
#   1. benchmarks/memory_report.py (compile only) at MEM_CONFIGS: what is left of the step's
#      memory where pallas held more than the original SonicMoE;
#   2. pallas_forward.py --train-mixes: default against dw1-early (no barrier), same process,
#      default timed first and last (drift);
#   3. the layer benchmark of the pallas backend on the 12 paper configs and 4 presets, no
#      checks (step 1 of call 3 checks the gradients), with the seconds left until TOTAL_S.
#   run(command="bash scripts/h200_s8_bench.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s8_bench_out}
mkdir -p "$OUT/mem" "$OUT/mixes"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] memory report"
timeout "${MEM_S:-75}" $PY benchmarks/memory_report.py --out-dir "$OUT/mem" --rows 10 \
  --configs "${MEM_CONFIGS:-paper-1.4B-n512,paper-1.4B-n1024,olmoe-1b-7b,mixtral-8x7b}" \
  --variants pallas > "$OUT/mem/report.log" 2>&1
grep -E "^== |^ +[0-9.]+[MG]iB\( *[0-9]+%\)" "$OUT/mem/report.log" | cut -c1-150 | head -n 60
grep -E "Error" "$OUT/mem/report.log" | head -5

echo "== [$(since) s] --train-mixes (default, dw1-early, default-again)"
timeout "${MIX_S:-90}" $PY benchmarks/pallas_forward.py --out-dir "$OUT/mixes" \
  --configs "${MIX_CONFIGS:-30B-1024,1.4B-512}" --parts train --train-mixes \
  --train-only default,dw1-early,default-again --skip-check --skip-baselines --iters 5 \
  > "$OUT/mixes/run.log" 2>&1
grep -E "^==|train\[" "$OUT/mixes/run.log" | tail -n 12 | cut -c1-200

left=$(( ${TOTAL_S:-588} - $(since) ))
echo "== [$(since) s] layer benchmark, ${left} s"
WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
  BENCH_ARGS="--configs paper presets --backends pallas --baselines none --warmup 1 --iters 5 --no-check --no-plots --tag ${BENCH_TAG:-pallas-s8}" \
  bash benchmarks/run_h200.sh 2>&1 | tail -n 22
echo "== [$(since) s] done"
