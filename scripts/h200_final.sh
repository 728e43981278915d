#!/usr/bin/env bash
# One device call that re-records the H200 results of a session's final code (~10 minutes):
#   1. the sharding GPU tests (pallas / ffi kernels inside the layer's shard_map, native
#      ragged_all_to_all), the Triton GPU tests, the token-rounding selection timing and
#      examples/train_sharded.py on the one GPU;
#   2. benchmarks/run_h200.sh with whatever time is left (BENCH_ARGS picks implementations).
#   run(command="bash scripts/h200_final.sh", carry=[".gpu_wheels",
#       "sonic_jax/ffi/libsonic_jax_cuda.so"], timeout_s=600)
# Knobs: FINAL_TOTAL_S (default 575: seconds for everything), BENCH_ARGS (as run_h200.sh).
set -uo pipefail
T0=$(date +%s)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-$PWD/final_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
WHEELS=${WHEELS_DIR:-.gpu_wheels}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      "$WHEELS"/*.whl || echo "warning: wheel install failed"
  export PYTHONPATH=$PYTHONPATH:/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages
fi
echo "== sharding GPU tests"
timeout ${SHARD_TEST_S:-120} $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_sharding_gpu.py 2>&1 \
  | tee "$OUT/sharding-gpu-tests.log" | tail -n 8
echo "== Triton routing / combine GPU tests"
timeout ${TRITON_TEST_S:-70} $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_triton.py 2>&1 \
  | tee "$OUT/triton-gpu-tests.log" | tail -n 8
echo "== token-rounding selection: argsort vs bisection"
timeout ${SELECT_S:-40} $PY benchmarks/token_rounding_select.py \
  --out "$OUT/token-rounding-select-h200.md" 2>&1 | tail -n 4
echo "== examples/train_sharded.py on the GPU (pallas, expert axis, ragged exchange)"
timeout ${TRAIN_S:-70} $PY examples/train_sharded.py --backend pallas --steps 20 --batch 32 \
  --seq-len 256 --d-model 512 --d-ff 1024 --experts 16 --top-k 2 --exchange ragged 2>&1 \
  | tee "$OUT/train-sharded-gpu.log" | tail -n 6
LEFT=$(( ${FINAL_TOTAL_S:-575} - ($(date +%s) - T0) ))
echo "== benchmark with $LEFT s left"
WHEELS_DIR=installed BENCH_TOTAL_S=$LEFT BUILD_FFI=0 bash benchmarks/run_h200.sh
