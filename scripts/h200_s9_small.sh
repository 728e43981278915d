#!/usr/bin/env bash
# Session 9, device call 5: dh with two CTAs per SM at d <= 1536 (dh_config_for's new default).
#   1. the marked GPU tests of dh and of the layer gradients (float32 reference);
#   2. the layer benchmark of the pallas backend on the paper's 1.4B and 7B configs (the ones
#      the change touches), with the seconds left until TOTAL_S.
#   run(command="bash scripts/h200_s9_small.sh", carry=[".whl"], timeout_s=360)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_small_out}
begin_call
gpu_tests "${TEST_S:-130}" tests/test_pallas_backward.py -k "gpu_dh or gpu_layer_gradients"
layer_bench "${TOTAL_S:-340}" "${BENCH_TAG:-pallas-s9-small}" paper-1.4B-n256 paper-1.4B-n512 \
  paper-1.4B-n1024 paper-7B-n256 paper-7B-n512 paper-7B-n1024
echo "== [$(since) s] done"
