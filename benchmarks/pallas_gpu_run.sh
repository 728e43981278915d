#!/usr/bin/env bash
# One device call for the Pallas kernels: the pallas GPU tests (in the background: their GPU work
# is tiny, mostly compiles) and the config sweep (benchmarks/pallas_sweep.py) in the foreground.
#   run(command="bash benchmarks/pallas_gpu_run.sh 95")   # sweep budget in seconds
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUDGET=${1:-95}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
(timeout $((BUDGET + 45)) python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/test_pallas_forward.py tests/test_pallas_backward.py > "$OUT/gpu-tests.log" 2>&1
 echo "pytest rc=$?" >> "$OUT/gpu-tests.log") &
timeout $((BUDGET + 45)) python3 benchmarks/pallas_sweep.py --out-dir "$OUT" --budget-s "$BUDGET" \
  --iters 10 > "$OUT/sweep.stdout" 2>&1
echo "sweep rc=$?"
wait
tail -n 8 "$OUT/gpu-tests.log"
grep -v "^  " "$OUT/sweep.stdout" | tail -n 70
