#!/usr/bin/env bash
# One device call for session 7's new default tilings (logs straight into $OUT, so a call cut
# short keeps what it measured):
#   1. GPU tests: the layer's gradients with every default tiling against a float32 reference,
#      the XLA-gathered two-consumer dW ring against the one-consumer kernel;
#   2. the layer benchmark (benchmarks/run_h200.sh) of the pallas backend on the 12 paper
#      configs and the 4 presets, no checks (the kernels were checked in step 1 and in the
#      down-sweep run), with TOTAL_S minus what the tests took;
#   3. (MIX_S > 0 extra seconds, or time the benchmark left) pallas_forward.py --train-mixes:
#      the layer step with per-kernel backward gather modes at MIX_CONFIGS (time and memory).
#   run(command="bash scripts/h200_defaults.sh", carry=[".whl"], timeout_s=600)
# Knobs: TEST_S (130), TOTAL_S (585: tests + benchmark), MIX_S (0), MIX_CONFIGS, BENCH_TAG.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/defaults_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] GPU tests: layer gradients, the XLA-gathered dW ring"
timeout "${TEST_S:-130}" $PY -m pytest -m gpu -p no:cacheprovider -rA --tb=short \
  tests/test_pallas_backward.py -k "gpu_layer_gradients or (gpu_wgrad_fused_gather and ring)" 2>&1 \
  | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -n 14

left=$(( ${TOTAL_S:-585} - $(since) ))
echo "== [$(since) s] layer benchmark, ${left} s"
WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
  BENCH_ARGS="--configs paper presets --backends pallas --baselines none --warmup 1 --iters 5 --no-check --no-plots --tag ${BENCH_TAG:-pallas-s7}" \
  bash benchmarks/run_h200.sh 2>&1 | tail -n 30

left=$(( ${TOTAL_S:-585} + ${MIX_S:-0} - $(since) ))
if [ "$left" -gt 30 ]; then
  echo "== [$(since) s] per-kernel backward gather modes (--train-mixes), ${left} s"
  mkdir -p "$OUT/mixes"
  timeout "$left" $PY benchmarks/pallas_forward.py --out-dir "$OUT/mixes" \
    --configs "${MIX_CONFIGS:-120B-1024,1.4B-512}" --parts train --train-mixes --skip-check \
    --skip-baselines --iters 5 2>&1 | grep "train\[" | tail -n 12
fi
echo "== [$(since) s] done"
