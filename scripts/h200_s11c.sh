#!/usr/bin/env bash
# Session 11, device call 3: with the Triton row dispatch as the default row gather,
#   1. GPU tests of sonic_jax.triton.dispatch (bit for bit against x[gather_idx]);
#   2. kernel_profile.py (variants taking turns): at n = 256 and at n = 512 with d = 4096, where
#      backward_gathers="auto" gathers inside the kernels, against XLA-gather kernels fed by the
#      dispatch (pallas:xla); at d <= 1536 the row-split 128 x 256 dh tile against the two-CTA
#      default.
#   run(command="bash scripts/h200_s11c.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s11c_out}
begin_call
gpu_tests "${TEST_S:-60}" tests/test_triton.py -k "gpu_dispatch"
ROWS=dh.ring=true:dh.ctas_per_sm=1:dh.num_consumers=2:dh.consumer_split=m:dh.h_source=gmem
ROWS=$ROWS:dh.block_k=32:dh.max_concurrent_steps=6:dh.epi_buffers=2:dh.block_n=256:dh.epi_n=64
export PROF_ROUNDS=${PROF_ROUNDS:-3}
PROF_TAG=gathers kernel_profile "${PROF_S:-200}" \
  "${PROF_CONFIGS:-paper-120B-n512,paper-30B-n256}" "pallas,pallas:xla" 0.3
kernel_profile "$(( ${TOTAL_S:-400} - $(since) ))" "${PROF_CONFIGS2:-paper-1.4B-n512,paper-7B-n512}" \
  "pallas,pallas::$ROWS" 0.1
echo "== [$(since) s] done"
