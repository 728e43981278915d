#!/usr/bin/env bash
# Session 9, device call 3: dh on the warp-specialized ring fed by TMA (DhConfig(ring=True)).
#   1. the marked GPU tests of dh (default, fused, ring against the xla backend);
#   2. benchmarks/kernel_profile.py: per-kernel times of the layer step, the default against
#      pallas::dh-ring, at PROF_CONFIGS.
#   run(command="bash scripts/h200_s9_ring.sh", carry=[".whl"], timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_ring_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_pallas_backward.py -k "gpu_dh"
kernel_profile "${PROF_S:-250}" \
  "${PROF_CONFIGS:-paper-1.4B-n512,paper-7B-n512,paper-30B-n1024,paper-120B-n1024}" \
  "${PROF_VARIANTS:-pallas,pallas::dh-ring}" 0.05
echo "== [$(since) s] done"
