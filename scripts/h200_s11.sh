#!/usr/bin/env bash
# Next device call (prepared in session 10, not yet run): dh variants after the wide tile.
#   1. the marked GPU tests of dh (the wide kernels with H loads issued ahead, and the row-split
#      64 x 256-per-consumer tile among them) against the default kernel and the xla backend, and
#      of the layer's gradients (d = 4096 among them: the wide dh default) against float32;
#   2. kernel_profile.py: the default against the wide tile with H loads ahead
#      (DhConfig.h_prefetch) and against the row-split 64 x 256 tile with and without them, at
#      d = 4096 (where the wide tile is the default) and d = 2048 (where it is not).
#   run(command="bash scripts/h200_s11.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s11_out}
begin_call
gpu_tests "${TEST_S:-180}" tests/test_pallas_backward.py -k "gpu_dh or gpu_layer_gradients"
COMMON=dh.ring=true:dh.epi_n=64:dh.ctas_per_sm=1:dh.num_consumers=2:dh.h_source=gmem
COMMON=$COMMON:dh.block_k=32:dh.max_concurrent_steps=6:dh.epi_buffers=2
WIDE_PF=$COMMON:dh.block_n=128:dh.consumer_split=n:dh.h_prefetch=true
ROWS=$COMMON:dh.block_n=256:dh.consumer_split=m
kernel_profile "${PROF_S:-360}" \
  "${PROF_CONFIGS:-paper-120B-n1024,paper-30B-n1024,olmoe-1b-7b,qwen3-30b-a3b}" \
  "pallas,pallas::$WIDE_PF,pallas::$ROWS,pallas::$ROWS:dh.h_prefetch=true" 0.3
echo "== [$(since) s] done"
