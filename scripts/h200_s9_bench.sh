#!/usr/bin/env bash
# Session 9, device call 1: the layer with dH written over H in place and the slimmer dW1 barrier.
#   1. the marked GPU tests of dH and the layer gradients (float32 reference);
#   2. benchmarks/memory_report.py (compile only) at MEM_CONFIGS, the configs where pallas held
#      more than the original SonicMoE in session 8;
#   3. pallas_forward.py --train-mixes: default against dw1-early (no barrier) at MIX_CONFIGS;
#   4. the layer benchmark of the pallas backend on the 12 paper configs and 4 presets.
#   run(command="bash scripts/h200_s9_bench.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_bench_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_pallas_backward.py -k "gpu_layer_gradients or gpu_dh"
memory_report "${MEM_S:-75}" 10 \
  "${MEM_CONFIGS:-paper-1.4B-n512,paper-1.4B-n1024,mixtral-8x7b}" pallas
train_mixes "${MIX_S:-70}" "${MIX_CONFIGS:-1.4B-512,7B-512}" default,dw1-early,default-again
layer_bench "${TOTAL_S:-585}" "${BENCH_TAG:-pallas-s9}" paper presets
echo "== [$(since) s] done"
