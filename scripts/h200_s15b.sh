#!/usr/bin/env bash
# Session 15, call 2: the scores' cotangent behind dW1 (experts.py), so that the router's
# recomputed backward runs after the (P, ·) buffers are dead. Memory report of the step at four
# configs, the layer benchmark of the configs whose peak it may move, and dW1 / dW2 against an
# XLA dense matmul of the same total shape (not measured since session 7's kernels).
#   run(command="bash scripts/h200_s15b.sh", timeout_s=595)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s15b_out}
begin_call
memory_report 130 6 qwen3-30b-a3b,olmoe-1b-7b,paper-1.4B-n256,paper-30B-n1024 pallas
echo "== [$(since) s] dW1 / dW2 against dense"
timeout 200 $PY benchmarks/pallas_backward.py --out "$OUT" --only wgrad --skip-correctness \
  --iters 10 > "$OUT/wgrad.log" 2>&1
tail -n 25 "$OUT/wgrad.log" | cut -c1-200
layer_bench "${TOTAL_S:-580}" "${BENCH_TAG:-s15b}" ${CONFIGS:-qwen3-30b-a3b olmoe-1b-7b \
  paper-1.4B-n256 paper-7B-n256 paper-1.4B-n512 mixtral-8x7b}
echo "== [$(since) s] done"
