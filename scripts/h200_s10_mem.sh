#!/usr/bin/env bash
# Session 10, device call 5: the layer step's memory (compile only, XLA's buffer assignment) with
# the cotangent behind an optimization barrier on the output (runner.fwdbwd_step), as a training
# step's loss orders it, for the pallas backend; largest configs against the original first.
# The XLA dump stays in /tmp (too many files for $OUT); the report log and per-config reports
# are copied.
#   run(command="bash scripts/h200_s10_mem.sh", carry=[".whl"], timeout_s=260)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_mem_out}
begin_call
CONFIGS=${CONFIGS:-paper-30B-n256,paper-120B-n512,paper-30B-n512,paper-120B-n1024,qwen3-30b-a3b,paper-7B-n256,paper-120B-n2048,paper-30B-n1024,paper-1.4B-n512,paper-1.4B-n256,paper-1.4B-n1024,deepseek-v3-like,paper-7B-n512,paper-7B-n1024,olmoe-1b-7b,mixtral-8x7b}
echo "== [$(since) s] memory report"
timeout "${MEM_S:-170}" $PY benchmarks/memory_report.py --out-dir /tmp/mem --rows 4 \
  --configs "$CONFIGS" --variants pallas > "$OUT/memory-report.log" 2>&1
grep -E "^== " "$OUT/memory-report.log" | cut -c1-160
echo "== [$(since) s] done"
