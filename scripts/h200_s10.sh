#!/usr/bin/env bash
# Session 10, device call 2: dh on the wide ring kernel (two consumers side by side on a
# 128 x 256 CTA tile, H read from HBM straight into registers; DhConfig(consumer_split="n",
# h_source="gmem")) against the default dh.
#   1. the marked GPU tests of dh, the wide kernels and the two-consumer row-split ones among them,
#      against the default kernel and the xla backend;
#   2. kernel_profile.py: the default against the wide kernel with 2 stages of block_k 64 and
#      with 4 stages of block_k 32, at d = 768, 1536 and 4096.
#   run(command="bash scripts/h200_s10.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py -k "gpu_dh"
WIDE=dh.ring=true:dh.block_n=128:dh.epi_n=64:dh.ctas_per_sm=1:dh.num_consumers=2
WIDE=$WIDE:dh.consumer_split=n:dh.h_source=gmem:dh.max_concurrent_steps=2:dh.block_k=64
WIDE32=${WIDE/max_concurrent_steps=2:dh.block_k=64/max_concurrent_steps=4:dh.block_k=32}
kernel_profile "${PROF_S:-330}" \
  "${PROF_CONFIGS:-paper-120B-n1024,paper-30B-n1024,paper-1.4B-n512,paper-7B-n1024}" \
  "pallas,pallas::$WIDE,pallas::$WIDE32" 0.3
echo "== [$(since) s] done"
