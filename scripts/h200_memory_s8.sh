#!/usr/bin/env bash
# Session 8, device call 1: where the pallas layer step's memory goes, and what fused-x costs.
#   1. benchmarks/memory_report.py (compile only): XLA's buffer assignment of the fwd+bwd step
#      for the configs where pallas holds more than the original SonicMoE, with
#      backward_gathers "auto" (default), "fused-x" and "fused".
#   2. pallas_forward.py --train-mixes, variants default / fused-dw1 (= fused-x) / default-again
#      (drift check) at MIX_CONFIGS: the speed cost of fused-x per config.
#   3. up_proj fused sweep at 120B-2048 (forward 0.97x the paper there).
#   run(command="bash scripts/h200_memory_s8.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/memory_s8_out}
begin_call mem mixes up
memory_report "${MEM_S:-170}" 12 \
  "${MEM_CONFIGS:-paper-1.4B-n512,paper-7B-n512,olmoe-1b-7b,paper-30B-n1024,mixtral-8x7b,paper-1.4B-n1024,qwen3-30b-a3b}" \
  pallas,pallas:fused-x,pallas:fused
train_mixes "${MIX_S:-300}" \
  "${MIX_CONFIGS:-30B-1024,120B-2048,DeepSeek-V3-like,OLMoE-1B-7B,7B-512,1.4B-512,Mixtral-8x7B}" \
  default,fused-dw1,default-again

echo "== [$(since) s] --fused-sweep (up_proj)"
timeout "${UP_S:-100}" $PY benchmarks/pallas_forward.py --out-dir "$OUT/up" \
  --configs "${UP_CONFIGS:-120B-2048}" --parts up --fused-sweep \
  --skip-check --iters 5 > "$OUT/up/run.log" 2>&1
grep -E "up_proj|dense_up" "$OUT/up/run.log" | tail -n 16 | cut -c1-220
echo "== [$(since) s] done"
