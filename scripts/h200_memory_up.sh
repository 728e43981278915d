#!/usr/bin/env bash
# One device call for what session 7 left open (logs straight into $OUT):
#   1. pallas_forward.py --train-mixes at MIX_CONFIGS: the layer step with dW1 gathering x in
#      the kernel ("fused-dw1", 2 GiB less at 120B-1024, about 1.5 % slower there) against the
#      default, to decide whether the default should drop the (P, d) gathered x at n >= 1024
#      (issue 4's memory target; pallas is above the original SonicMoE at 30B-1024, 120B-1024,
#      120B-2048 and the presets). Run-to-run drift was 4 % between identical variants in
#      session 7, so each config runs the default twice (first and last).
#   2. pallas_forward.py --fused-sweep --parts up at UP_CONFIGS (new: "fused split-m bk64 s3
#      w8"); the forward is 0.97x the paper's H100 figure at 120B-2048, up_proj is what is left.
#   3. (FFI_S > 0, carry sonic_jax/ffi/libsonic_jax_cuda.so) the ffi tests of the bf16 dW,
#      then the ffi GEMM sweep: the bf16 varlen-K kind's two schedules for dW1 / dW2.
#   run(command="bash scripts/h200_memory_up.sh", carry=[".whl"], timeout_s=600)
# Knobs: MIX_S (260), MIX_CONFIGS, UP_S (200), UP_CONFIGS, FFI_S (0).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/memory_up_out}
mkdir -p "$OUT/mixes" "$OUT/up"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== [$(since) s] --train-mixes"
timeout "${MIX_S:-260}" $PY benchmarks/pallas_forward.py --out-dir "$OUT/mixes" \
  --configs "${MIX_CONFIGS:-30B-1024,120B-2048,DeepSeek-V3-like}" --parts train --train-mixes \
  --skip-check --skip-baselines --iters 5 2>&1 | grep -E "^==|train\[" | tail -n 24

echo "== [$(since) s] --fused-sweep (up_proj)"
timeout "${UP_S:-200}" $PY benchmarks/pallas_forward.py --out-dir "$OUT/up" \
  --configs "${UP_CONFIGS:-120B-2048,120B-512,DeepSeek-V3-like}" --parts up --fused-sweep \
  --skip-check --iters 5 2>&1 | grep -E "up_proj|dense_up" | tail -n 24

if [ "${FFI_S:-0}" -gt 0 ]; then
  echo "== [$(since) s] ffi tests of the bf16 dW (tolerance fixed after session 7's run)"
  timeout 90 $PY -m pytest -m gpu -p no:cacheprovider -q tests/test_ffi.py \
    -k "backward_entry_points or VARLEN_K" 2>&1 | tee "$OUT/ffi-gpu-tests.log" | tail -n 4
  echo "== [$(since) s] ffi GEMM sweep"
  timeout "$FFI_S" $PY -m sonic_jax.ffi.sweep --configs 32768,4096,1024,128,8 --iters 5 \
    --json "$OUT/ffi-sweep.json" 2>&1 | grep -E "dw1|dw2|MEASURED" | tail -n 12
fi
echo "== [$(since) s] done"
