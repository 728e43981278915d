#!/usr/bin/env bash
# Session 9, device call 3: dh on the warp-specialized ring fed by TMA (DhConfig(ring=True)).
#   1. the marked GPU tests of dh (default, fused, ring against the xla backend);
#   2. benchmarks/kernel_profile.py: per-kernel times of the layer step, the default against
#      pallas::dh-ring, at PROF_CONFIGS.
#   run(command="bash scripts/h200_s9_ring.sh", carry=[".whl"], timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_ring_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== [$(since) s] GPU tests"
timeout "${TEST_S:-120}" $PY -m pytest -q -rA -m gpu tests/test_pallas_backward.py -k "gpu_dh" \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$OUT/gpu-tests.log" | head -n 20 | cut -c1-200
echo "== [$(since) s] kernel profile"
timeout "${PROF_S:-250}" $PY benchmarks/kernel_profile.py --out-dir "$OUT" --iters 10 \
  --configs "${PROF_CONFIGS:-paper-1.4B-n512,paper-7B-n512,paper-30B-n1024,paper-120B-n1024}" \
  --variants "${PROF_VARIANTS:-pallas,pallas::dh-ring}" --min-ms 0.05 2>&1 \
  | tee "$OUT/profile.log" | cut -c1-100
echo "== [$(since) s] done"
