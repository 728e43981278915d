#!/usr/bin/env bash
# Session 9, device call 2: per-kernel times of the layer step (benchmarks/kernel_profile.py)
# where f+b misses the paper (1.4B-n512): the default against dW1 without the barrier.
#   run(command="bash scripts/h200_s9_profile.sh", carry=[".whl"], timeout_s=300)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_profile_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${PROF_S:-200}" $PY benchmarks/kernel_profile.py --out-dir "$OUT" --iters 10 \
  --configs "${PROF_CONFIGS:-paper-1.4B-n512}" \
  --variants "${PROF_VARIANTS:-pallas,pallas::dw1-early}" 2>&1 | tee "$OUT/profile.log" | cut -c1-120
echo "== [$(since) s] done"
