#!/usr/bin/env bash
# Session 13, device call 4 (the last of the session's budget):
#   1. the layer-gradient GPU tests call 3 ran out of time for (float32 reference, 3 shapes);
#   2. kernel_profile.py where call 3's layer benchmark read slower than session 12 at d = 4096
#      (paper-120B-n1024, paper-30B-n512) and faster (paper-30B-n256): the new defaults against
#      dh without the swizzled epilogue, and down_proj / dx_pairs without theirs;
#   3. memory_report.py: ffi against ffi:dw1-last at paper-30B-n256.
#   run(command="bash scripts/h200_s13d.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s13d_out}
begin_call
gpu_tests "${TEST_S:-110}" tests/test_pallas_backward.py -k "layer_gradients"
PROF_ROUNDS=${PROF_ROUNDS:-2} kernel_profile "${PROF_S:-250}" \
  paper-120B-n1024,paper-30B-n512,paper-30B-n256 \
  "pallas,pallas::dh.epilogue_swizzle=false,pallas::down_proj.epilogue_swizzle=false:dx_pairs.epilogue_swizzle=false" 0.3
memory_report "${MEM_S:-80}" 6 paper-30B-n256 ffi,ffi:dw1-last
echo "== [$(since) s] done"
