#!/usr/bin/env bash
# One device call for the Pallas kernels: the config sweep (benchmarks/pallas_sweep.py), then the
# pallas GPU tests.
#   run(command="bash benchmarks/pallas_gpu_run.sh 55 3 \"not fused\"")
#   (sweep budget in seconds; sweep phase 1, 2 or 3, see pallas_sweep.py --help; pytest -k)
# (Session 2's first call ran the tests in the background during the sweep: that slowed the
# first timings of the sweep, e.g. the dense baselines, so they now run one after the other.)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUDGET=${1:-95}
PHASE=${2:-1}
TESTS_K=${3:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
timeout $((BUDGET + 45)) python3 benchmarks/pallas_sweep.py --out-dir "$OUT" --budget-s "$BUDGET" \
  --iters 10 --phase "$PHASE" > "$OUT/sweep.stdout" 2>&1
echo "sweep rc=$?"
timeout 75 python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} \
  tests/test_pallas_forward.py tests/test_pallas_backward.py > "$OUT/gpu-tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/gpu-tests.log"
tail -n 8 "$OUT/gpu-tests.log"
grep -v "^  " "$OUT/sweep.stdout" | tail -n 70
