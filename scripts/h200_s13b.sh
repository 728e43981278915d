#!/usr/bin/env bash
# Session 13, device call 2: dh's swizzled epilogue (DhConfig.epilogue_swizzle) where a short K
# loop (d = 768, 1536) leaves the epilogue dominating each tile (dh at paper-1.4B-n512: 0.636 ms,
# about 200 TFLOP/s):
#   1. GPU tests: dh with and without it on four tiles against the xla backend (dH, A', dS);
#   2. kernel_profile.py at paper-1.4B-n512 / -n1024 (dh fed XLA-gathered dO; default: two CTAs
#      per SM, 64-column tiles): the default with the swizzle, the row-split 128 x 256 ring tile
#      with it, the row-split 128 x 128 ring tile with H prefetched into SMEM and it, and (dh
#      unchanged) down_proj / dx_pairs with their swizzled epilogue (an 8- or 16-step K loop);
#   3. kernel_profile.py at paper-1.4B-n256, paper-7B-n256 (in-kernel dO gather) and paper-7B-n512
#      (row-split ring tile): the default with the swizzle, and the 128 x 128 SMEM-H tile with it.
#   run(command="bash scripts/h200_s13b.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s13b_out}
begin_call p1 p2
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py -k "swizzled_epilogue"
SWZ=dh.epilogue_swizzle=true
W=dh.ring=true:dh.ctas_per_sm=1:dh.block_n=256:dh.block_k=32:dh.max_concurrent_steps=6:dh.num_consumers=2:dh.consumer_split=m:dh.h_source=gmem:dh.epi_buffers=2
S128=dh.block_n=128:dh.h_source=smem
GEMM_SWZ=down_proj.epilogue_swizzle=true:dx_pairs.epilogue_swizzle=true
OUT=$OUT/p1 kernel_profile "${PROF1_S:-230}" paper-1.4B-n512,paper-1.4B-n1024 \
  "pallas,pallas::$SWZ,pallas::$W:$SWZ,pallas::$W:$S128:$SWZ,pallas::$GEMM_SWZ" 0.1
OUT=$OUT/p2 kernel_profile "${PROF2_S:-200}" paper-1.4B-n256,paper-7B-n256,paper-7B-n512 \
  "pallas,pallas::$SWZ,pallas::$S128:$SWZ" 0.1
echo "== [$(since) s] done"
