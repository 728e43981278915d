#!/usr/bin/env bash
# Session 14, call 5: the layer benchmark, with call 4's dW ring, of the paper configs call 4
# did not reach (largest d first: the 120B and 30B rows are furthest from the paper's figures).
#   run(command="bash scripts/h200_s14e.sh", timeout_s=395)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14e_out}
begin_call
layer_bench "${TOTAL_S:-370}" "${BENCH_TAG:-s14e}" ${CONFIGS:-paper-120B-n1024 paper-120B-n2048 \
  paper-30B-n1024 paper-7B-n512 paper-7B-n1024 paper-1.4B-n512 paper-1.4B-n256 paper-1.4B-n1024}
echo "== [$(since) s] done"
