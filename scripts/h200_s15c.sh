#!/usr/bin/env bash
# Session 15, call 3: what route()'s recomputed router GEMM costs. Per-kernel profile of the step
# at three configs, the default (route: logits recomputed in the backward) against
# "@saved-logits" (route_logits: autodiff keeps the logits), the variants taking turns.
#   run(command="bash scripts/h200_s15c.sh", timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s15c_out}
begin_call
PROF_ROUNDS=4 PROF_ITERS=10 kernel_profile 380 \
  "${CONFIGS:-paper-1.4B-n512,paper-1.4B-n256,qwen3-30b-a3b}" "pallas,pallas@saved-logits" 0.004
echo "== [$(since) s] done"
