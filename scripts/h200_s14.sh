#!/usr/bin/env bash
# Next device call (prepared in session 13, not yet run):
#   1. the layer-gradient GPU tests against the float32 reference at all three shapes with
#      session 13's defaults (its calls ran out of time before d = 4096; about 50 s each);
#   2. the pallas layer benchmark of the configs session 13's final run did not reach
#      (Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3-like) and of those it read 2-4 % below the same
#      code's kernel profile (the 120B configs, paper-30B-n512);
#   3. memory_report.py of pallas at Qwen3-30B-A3B (1.001x the original SonicMoE).
#   run(command="bash scripts/h200_s14.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14_out}
begin_call
gpu_tests "${TEST_S:-200}" tests/test_pallas_backward.py -k "layer_gradients"
memory_report "${MEM_S:-60}" 6 qwen3-30b-a3b pallas
layer_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s14}" ${CONFIGS:-qwen3-30b-a3b mixtral-8x7b \
  deepseek-v3-like paper-120B-n512 paper-120B-n1024 paper-120B-n2048 paper-30B-n512}
echo "== [$(since) s] done"
