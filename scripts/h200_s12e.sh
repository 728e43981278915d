#!/usr/bin/env bash
# Session 12, device call 5 (the last of the session's budget):
#   1. GPU tests of the layer gradients against the float32 reference (all three shapes: the
#      dispatch-fed backward with dx_pairs ordered after dW2, the in-kernel-gather one at n = 256,
#      d = 4096), and the dh kernels against the xla backend (dS through plan.expert_ids since
#      this call);
#   2. the pallas layer benchmark on the configs nearest the paper's figure first, with the
#      seconds left (dx_pairs after dW2; tile metadata without binary searches).
#   run(command="bash scripts/h200_s12e.sh", carry=[".whl"], timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12e_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py -k "gpu_layer_gradients or gpu_dh_matches_xla or small_d"
layer_bench "${TOTAL_S:-330}" "${BENCH_TAG:-s12-final}" ${CONFIGS:-paper-1.4B-n512 paper-1.4B-n1024 \
  paper-7B-n512 paper-7B-n256 paper-1.4B-n256 paper-120B-n1024 paper-120B-n2048 paper-30B-n512 \
  paper-30B-n1024 paper-7B-n1024 deepseek-v3-like qwen3-30b-a3b}
echo "== [$(since) s] done"
