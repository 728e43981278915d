#!/usr/bin/env bash
# Session 15, call 5: the layer benchmark of all 16 configs with session 15's routing (route():
# logits recomputed in the backward, bf16 router-backward GEMMs, the scores' cotangent after dW1),
# the paper configs nearest their figures first.
#   run(command="bash scripts/h200_s15e.sh", timeout_s=560)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s15e_out}
begin_call
layer_bench "${TOTAL_S:-530}" "${BENCH_TAG:-s15e}" ${CONFIGS:-paper-1.4B-n512 paper-1.4B-n256 \
  paper-7B-n256 paper-30B-n256 paper-120B-n1024 paper-120B-n2048 paper-120B-n512 \
  qwen3-30b-a3b paper-1.4B-n1024 paper-7B-n512 paper-7B-n1024 paper-30B-n512 paper-30B-n1024 \
  olmoe-1b-7b mixtral-8x7b deepseek-v3-like}
echo "== [$(since) s] done"
