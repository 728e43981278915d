#!/usr/bin/env bash
# Session 14, call 2: dh's pipelines = 2 rebuilt with one producer feeding both consumers' rings
# (three warpgroups; call 1's producer per pipeline hit ptxas' 128-register cap):
#   1. its GPU tests against the xla backend (TMA-fed and in-kernel gather, 64 x 256);
#   2. kernel_profile.py: dh with two pipelines (64 x 256 and 128 x 128, H from HBM) against
#      the default at d = 768 (paper-1.4B-n512) and d = 4096 (paper-120B-n1024).
#   run(command="bash scripts/h200_s14b.sh", timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14b_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py -k "2pipes"
P2=dh.ring=true:dh.pipelines=2:dh.num_consumers=1:dh.ctas_per_sm=1:dh.block_k=32:dh.max_concurrent_steps=4:dh.h_source=gmem:dh.epi_buffers=2:dh.epilogue_swizzle=true
PROF_ROUNDS=${PROF_ROUNDS:-3} kernel_profile "${PROF_S:-200}" paper-1.4B-n512,paper-120B-n1024 \
  "pallas,pallas::$P2:dh.block_m=64:dh.block_n=256,pallas::$P2:dh.block_m=128:dh.block_n=128" 0.3
echo "== [$(since) s] done"
