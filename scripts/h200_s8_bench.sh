#!/usr/bin/env bash
# Session 8, device call 2: the layer with dW1 behind an optimization barrier (ExpertKernels.
# dw1_last; PallasKernels default), logs straight into $OUT:
#   1. benchmarks/memory_report.py (compile only) at MEM_CONFIGS: what is left of the step's
#      memory where pallas held more than the original SonicMoE;
#   2. pallas_forward.py --train-mixes: default against dw1-early (no barrier), same process,
#      default timed first and last (drift);
#   3. the layer benchmark of the pallas backend on the 12 paper configs and 4 presets, no
#      checks (step 1 of call 3 checks the gradients), with the seconds left until TOTAL_S.
#   run(command="bash scripts/h200_s8_bench.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s8_bench_out}
begin_call
memory_report "${MEM_S:-75}" 10 \
  "${MEM_CONFIGS:-paper-1.4B-n512,paper-1.4B-n1024,olmoe-1b-7b,mixtral-8x7b}" pallas
train_mixes "${MIX_S:-90}" "${MIX_CONFIGS:-30B-1024,1.4B-512}" default,dw1-early,default-again
layer_bench "${TOTAL_S:-588}" "${BENCH_TAG:-pallas-s8}" paper presets
echo "== [$(since) s] done"
