#!/usr/bin/env bash
# Session 9, device call 5: dh with two CTAs per SM at d <= 1536 (dh_config_for's new default).
#   1. the marked GPU tests of dh and of the layer gradients (float32 reference);
#   2. the layer benchmark of the pallas backend on the paper's 1.4B and 7B configs (the ones
#      the change touches), with the seconds left until TOTAL_S.
#   run(command="bash scripts/h200_s9_small.sh", carry=[".whl"], timeout_s=360)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_small_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== [$(since) s] GPU tests"
timeout "${TEST_S:-130}" $PY -m pytest -q -rA -m gpu tests/test_pallas_backward.py \
  -k "gpu_dh or gpu_layer_gradients" > "$OUT/gpu-tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$OUT/gpu-tests.log" | head -n 20 | cut -c1-200
left=$(( ${TOTAL_S:-340} - $(since) ))
echo "== [$(since) s] layer benchmark, ${left} s"
WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
  BENCH_ARGS="--configs paper-1.4B-n256 paper-1.4B-n512 paper-1.4B-n1024 paper-7B-n256 paper-7B-n512 paper-7B-n1024 --backends pallas --baselines none --warmup 1 --iters 5 --no-check --no-plots --tag ${BENCH_TAG:-pallas-s9-small}" \
  bash benchmarks/run_h200.sh 2>&1 | tail -n 12
echo "== [$(since) s] done"
