#!/usr/bin/env bash
# Session 9, device call 2: per-kernel times of the layer step (benchmarks/kernel_profile.py)
# where f+b misses the paper (1.4B-n512): the default against dW1 without the barrier.
#   run(command="bash scripts/h200_s9_profile.sh", carry=[".whl"], timeout_s=300)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_profile_out}
begin_call
kernel_profile "${PROF_S:-200}" "${PROF_CONFIGS:-paper-1.4B-n512}" \
  "${PROF_VARIANTS:-pallas,pallas::dw1-early}" 0.01
echo "== [$(since) s] done"
