#!/usr/bin/env bash
# Next device call (prepared in session 13, not yet run):
#   1. GPU tests: the layer gradients against the float32 reference at all three shapes with
#      session 13's defaults (its calls ran out of time before d = 4096; about 50 s each), and
#      dh with two producer/consumer pipelines per CTA (DhConfig.pipelines = 2, opt-in, new in
#      session 13 and so far run only in the interpreter) against the xla backend;
#   2. kernel_profile.py: dh with two pipelines (64 x 256 and 128 x 128 tiles, H from HBM)
#      against the default, at d = 768 (paper-1.4B-n512) and d = 4096 (paper-120B-n1024);
#   3. the pallas layer benchmark of the configs session 13's final run did not reach
#      (Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3-like) and of those it read 2-4 % below the same
#      code's kernel profile (the 120B configs, paper-30B-n512), as far as the time allows.
#   run(command="bash scripts/h200_s14.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14_out}
begin_call
gpu_tests "${TEST_S:-240}" tests/test_pallas_backward.py -k "layer_gradients or 2pipes"
P2=dh.ring=true:dh.pipelines=2:dh.num_consumers=1:dh.ctas_per_sm=1:dh.block_k=32:dh.max_concurrent_steps=4:dh.h_source=gmem:dh.epi_buffers=2:dh.epilogue_swizzle=true
PROF_ROUNDS=${PROF_ROUNDS:-3} kernel_profile "${PROF_S:-170}" paper-1.4B-n512,paper-120B-n1024 \
  "pallas,pallas::$P2:dh.block_m=64:dh.block_n=256,pallas::$P2:dh.block_m=128:dh.block_n=128" 0.3
layer_bench "${TOTAL_S:-570}" "${BENCH_TAG:-s14}" ${CONFIGS:-qwen3-30b-a3b mixtral-8x7b \
  deepseek-v3-like paper-120B-n1024 paper-120B-n512 paper-120B-n2048 paper-30B-n512}
echo "== [$(since) s] done"
