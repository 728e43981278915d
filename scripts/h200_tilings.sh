#!/usr/bin/env bash
# One device call for what session 6 left unverified or untimed (logs straight into $OUT, so a
# call cut short keeps what it measured):
#   1. the Pallas forward GPU tests with the session-6 default tilings (the n = 2048 shape takes
#      dx_pairs' row-split ring), and the wgrad GPU test of the two-consumer XLA-gather ring;
#   2. benchmarks/pallas_backward.py --only wgrad: "wgrad ring 2wg" rows against one warpgroup;
#   3. benchmarks/pallas_forward.py --down-sweep at DeepSeek-V3-like / 30B-1024: block_k 64 for
#      dx_pairs' transposed W1 (64-byte TMA rows with block_k 32), ring tilings of down_proj;
#   4. (FFI_S > 0, carry sonic_jax/ffi/libsonic_jax_cuda.so) the full ffi GPU suite, which
#      stopped at a test bug in session 6.
#   run(command="bash scripts/h200_tilings.sh", carry=[".whl"], timeout_s=600)
# Knobs: TEST_S (160), PB_S (120), PF_S (200), PF_CONFIGS, FFI_S (0).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/tilings_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] GPU tests: forward defaults, cross-tile, wgrad rings"
timeout "${TEST_S:-160}" $PY -m pytest -m gpu -q -p no:cacheprovider -x \
  tests/test_pallas_forward.py tests/test_pallas_backward.py \
  -k "gpu_forward or gpu_cross_tile or gpu_wgrad_fused_gather" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -n 8

if [ "${PB_S:-120}" -gt 0 ]; then
  echo "== [$(since) s] pallas_backward.py --only wgrad"
  timeout "${PB_S:-120}" $PY benchmarks/pallas_backward.py --out "$OUT" --only wgrad \
    --skip-correctness --iters 10 2>&1 | tail -n 20
fi

if [ "${PF_S:-200}" -gt 0 ]; then
  echo "== [$(since) s] pallas_forward.py --down-sweep"
  timeout "${PF_S:-200}" $PY benchmarks/pallas_forward.py --out-dir "$OUT" \
    --configs "${PF_CONFIGS:-DeepSeek-V3-like,30B-1024}" --parts down,dx --down-sweep \
    --skip-check --no-fused --iters 5 2>&1 | tail -n 30
fi

if [ "${FFI_S:-0}" -gt 0 ]; then
  echo "== [$(since) s] ffi GPU tests"
  timeout "${FFI_S}" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_ffi.py 2>&1 \
    | tee "$OUT/ffi-gpu-tests.log" | tail -n 8
fi
echo "== [$(since) s] done"
