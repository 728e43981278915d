#!/usr/bin/env bash
# Session 15, call 1: route() without saved logits. Its GPU tests, the memory report of the
# step at Qwen3-30B-A3B (3 MB over the original SonicMoE before) and two other configs, and the
# layer benchmark of the configs nearest their targets (a recomputed router GEMM costs time).
#   run(command="bash scripts/h200_s15.sh", timeout_s=590)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s15_out}
begin_call
gpu_tests 150 tests/test_router_top_k.py
timeout 120 $PY -m pytest -q -m gpu tests/test_triton.py -k "default_routing or moe_routing" \
  2>&1 | tail -n 3
memory_report 120 8 qwen3-30b-a3b,paper-1.4B-n256,deepseek-v3-like pallas
layer_bench "${TOTAL_S:-570}" "${BENCH_TAG:-s15}" ${CONFIGS:-qwen3-30b-a3b paper-1.4B-n256 \
  paper-7B-n256 paper-30B-n256 paper-120B-n1024 paper-120B-n2048 paper-120B-n512 deepseek-v3-like}
echo "== [$(since) s] done"
