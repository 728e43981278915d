#!/usr/bin/env bash
# One device call for the ffi backend's bf16 weight gradients (GemmKind.VARLEN_K_BF16, session
# 7; the library is built on the CPU box and carried), logs straight into $OUT:
#   1. the ffi GPU tests (every instantiated schedule against ragged_dot, the layer, command
#      buffers);
#   2. the layer benchmark of the ffi backend, presets first (DeepSeek-V3-like's memory is what
#      the fp32 gradients inflated), with the time left.
#   run(command="bash scripts/h200_ffi_bf16.sh",
#       carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"], timeout_s=600)
# Knobs: TEST_S (170), TOTAL_S (585), BENCH_CONFIGS ("presets paper").
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/ffi_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] ffi GPU tests"
timeout "${TEST_S:-170}" $PY -m pytest -m gpu -p no:cacheprovider -rA --tb=short tests/test_ffi.py \
  2>&1 | tee "$OUT/ffi-gpu-tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -n 14

left=$(( ${TOTAL_S:-585} - $(since) ))
echo "== [$(since) s] layer benchmark (ffi), ${left} s"
WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
  BENCH_ARGS="--configs ${BENCH_CONFIGS:-presets paper} --backends ffi --baselines none --warmup 1 --iters 5 --no-check --no-plots --tag ffi-s7" \
  bash benchmarks/run_h200.sh 2>&1 | tail -n 24
echo "== [$(since) s] done"
