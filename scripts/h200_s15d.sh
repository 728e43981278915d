#!/usr/bin/env bash
# Session 15, call 4: the router backward's GEMMs on bf16 dl (routing._router_top_k_bwd). GPU test
# of route(), then the per-kernel profile of call 3 again: default against "@saved-logits".
#   run(command="bash scripts/h200_s15d.sh", timeout_s=300); call 6 ran it again on the final
#   router backward (its GEMMs through jax.vjp).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s15d_out}
begin_call
gpu_tests 90 tests/test_router_top_k.py
PROF_ROUNDS=4 PROF_ITERS=10 kernel_profile 200 \
  "${CONFIGS:-paper-1.4B-n512,paper-7B-n256}" "pallas,pallas@saved-logits" 0.004
echo "== [$(since) s] done"
