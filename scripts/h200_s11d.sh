#!/usr/bin/env bash
# Session 11, device call 4: the new defaults (Triton row dispatch; row-split dh at d >= 1536).
#   1. GPU tests: the dispatch kernels bit for bit against x[gather_idx]; the layer's gradients
#      against float32 (and, bit for bit, against the same kernels fed by XLA's gathers);
#   2. kernel_profile.py at paper-120B-n512 (in-kernel gathers): the fused dh on the row-split
#      128 x 256 tile (H from HBM) against its default 128 x 128 one-consumer tile;
#   3. the layer benchmark of pallas on the configs whose kernels changed, with the seconds left.
#   run(command="bash scripts/h200_s11d.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s11d_out}
begin_call
gpu_tests "${TEST_S:-200}" tests/test_triton.py tests/test_pallas_backward.py \
  -k "gpu_dispatch or gpu_layer_gradients"
FROWS=dh.num_consumers=2:dh.consumer_split=m:dh.h_source=gmem:dh.epi_buffers=2:dh.block_n=256
FROWS=$FROWS:dh.epi_n=64
PROF_ROUNDS=2 kernel_profile "${PROF_S:-90}" "${PROF_CONFIGS:-paper-120B-n512}" \
  "pallas,pallas::$FROWS:dh.block_k=32:dh.max_concurrent_steps=6,pallas::$FROWS:dh.block_k=64:dh.max_concurrent_steps=3" 0.3
layer_bench "${TOTAL_S:-540}" "${BENCH_TAG:-s11}" ${CONFIGS:-paper-120B-n1024 paper-30B-n1024 paper-120B-n2048 paper-7B-n1024 paper-7B-n512 paper-1.4B-n512 paper-1.4B-n1024 olmoe-1b-7b qwen3-30b-a3b deepseek-v3-like mixtral-8x7b}
echo "== [$(since) s] done"
