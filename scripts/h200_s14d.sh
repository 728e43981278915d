#!/usr/bin/env bash
# Session 14, call 4: dW1 / dW2's ring kernel with K blocks from the expert's first row
# (rounded down to 8) instead of block_k-aligned ones, and the plain tile masked by each
# consumer alone (the shared tile only where a block reaches padding rows):
#   1. GPU tests: dW1 / dW2 against xla (default, fused gather, two consumers) and the layer
#      gradients against the float32 reference at the three shapes;
#   2. kernel_profile.py at DeepSeek-V3-like (E=256, ~512 rows per expert) and paper-120B-n1024;
#   3. the layer benchmark of the configs with the fewest rows per expert first.
#   run(command="bash scripts/h200_s14d.sh", timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14d_out}
begin_call
gpu_tests "${TEST_S:-260}" tests/test_pallas_backward.py -k "dw1 or dw2 or wgrad or layer_gradients"
PROF_ROUNDS=${PROF_ROUNDS:-3} kernel_profile "${PROF_S:-120}" deepseek-v3-like,paper-120B-n1024 pallas 0.3
layer_bench "${TOTAL_S:-585}" "${BENCH_TAG:-s14d}" ${CONFIGS:-deepseek-v3-like paper-30B-n256 \
  qwen3-30b-a3b paper-120B-n512 paper-30B-n512 olmoe-1b-7b paper-7B-n256 mixtral-8x7b}
echo "== [$(since) s] done"
