#!/usr/bin/env bash
# One device call for what is not the layer benchmark (~10 minutes), logs under $OUT:
#   0. (SHARD_TEST_S > 0) the sharding GPU tests: pallas / ffi kernels inside the layer's
#      shard_map, native ragged_all_to_all;
#   1. the Triton GPU tests (routing kernels, combine, the layer's default routing_impl="auto"
#      with gradients, in the Flax module and under vmap);
#   2. examples/train_sharded.py on the GPU (ffi backend with --check, then pallas): tokens/s;
#   3. python -m sonic_jax.triton.bench (routing / metadata / combine, every implementation);
#   4. benchmarks/token_rounding_select.py (token rounding's selection: bisection and the
#      radix-select kernels, masks checked before timing);
#   5. benchmarks/run_h200.sh with the time left (BENCH_ARGS picks what it runs).
#   run(command="bash scripts/h200_checks.sh", carry=[".gpu_wheels",
#       "sonic_jax/ffi/libsonic_jax_cuda.so"], timeout_s=600)
# .gpu_wheels holds the wheels to install (e.g. jax-triton and the PyTorch SonicMoE group).
# Knobs: TOTAL_S (default 575), SHARD_TEST_S (default 0: skipped), TRITON_TEST_S, TRAIN_FFI_S,
# TRAIN_PALLAS_S, TRITON_BENCH_S, SELECT_S, BENCH_ARGS. A device call returns at most 8 files from
# $OUT: the logs of steps 0-4 are packed into $OUT/logs.tgz, the benchmark writes into $OUT.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/checks_out}
LOGS=/tmp/checks_logs  # packed into $OUT/logs.tgz after every step (8-file limit of a call)
mkdir -p "$OUT" "$LOGS" /tmp/triton
pack() { tar czf "$OUT/logs.tgz" -C /tmp checks_logs triton; }
install_wheels .gpu_wheels /tmp/site/nvidia_cutlass_dsl/python_packages
if [ "${SHARD_TEST_S:-0}" -gt 0 ]; then
  echo "== [$(since) s] sharding GPU tests"
  timeout "$SHARD_TEST_S" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_sharding_gpu.py \
    2>&1 | tee "$LOGS/sharding-gpu-tests.log" | tail -n 8
  pack
fi
echo "== [$(since) s] Triton GPU tests"
timeout "${TRITON_TEST_S:-150}" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_triton.py \
  2>&1 | tee "$LOGS/triton-gpu-tests.log" | tail -n 8
pack
TRAIN="examples/train_sharded.py --steps 30 --batch 32 --seq-len 512 --d-model 1024 --d-ff 512
  --experts 32 --top-k 4 --layers 2"
echo "== [$(since) s] train_sharded.py on the GPU, ffi backend, with --check"
timeout "${TRAIN_FFI_S:-70}" $PY $TRAIN --backend ffi --check 2>&1 \
  | tee "$LOGS/train-sharded-ffi.log" | tail -n 5
pack
echo "== [$(since) s] Triton routing / combine benchmark"
timeout "${TRITON_BENCH_S:-200}" $PY -m sonic_jax.triton.bench --out /tmp/triton --iters 10 \
  2>&1 | tail -n 70 | tee /tmp/triton/stdout.txt | tail -n 45
pack
echo "== [$(since) s] token-rounding selection: argsort vs bisection vs the radix-select kernels"
timeout "${SELECT_S:-90}" $PY benchmarks/token_rounding_select.py \
  --out "$LOGS/token-rounding-select-h200.md" 2>&1 | tail -n 16
pack
echo "== [$(since) s] train_sharded.py on the GPU, pallas backend"
timeout "${TRAIN_PALLAS_S:-80}" $PY $TRAIN --backend pallas 2>&1 \
  | tee "$LOGS/train-sharded-pallas.log" | tail -n 4
pack
LEFT=$(( ${TOTAL_S:-575} - $(since) ))
echo "== [$(since) s] benchmark with $LEFT s left"
WHEELS_DIR=installed BENCH_TOTAL_S=$LEFT BUILD_FFI=0 RESULTS_DIR="$OUT" bash benchmarks/run_h200.sh
