#!/usr/bin/env bash
# Session 10, device call 3: dh_config_for picks the wide ring kernel at d >= 2048, n % 256 == 0
# (gather="xla"): two consumers side by side on a 128 x 256 CTA tile, H from HBM into
# registers, two staging buffers per consumer, 3 stages of block_k 64.
#   1. the marked GPU tests of the wide kernels against the default and the xla backend;
#   2. kernel_profile.py: that default against the previous one (one warpgroup, 128 x 128, H
#      prefetched to SMEM, 4 stages) and against the wide kernel with 6 stages of block_k 32;
#   3. the layer benchmark (whole fwd+bwd step) of the configs whose dh changed.
#   run(command="bash scripts/h200_s10_wide.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_wide_out}
begin_call
gpu_tests "${TEST_S:-90}" tests/test_pallas_backward.py -k "gpu_dh and wide"
OLD=dh.ring=false:dh.num_consumers=1:dh.consumer_split=m:dh.h_source=smem
OLD=$OLD:dh.max_concurrent_steps=4:dh.epi_buffers=3
K32=dh.block_k=32:dh.max_concurrent_steps=6
kernel_profile "${PROF_S:-170}" "${PROF_CONFIGS:-paper-120B-n1024,paper-30B-n1024}" \
  "pallas,pallas::$OLD,pallas::$K32" 0.3
layer_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s10-wide}" \
  ${CONFIGS:-paper-30B-n1024 paper-120B-n1024 paper-120B-n2048 presets}
echo "== [$(since) s] done"
