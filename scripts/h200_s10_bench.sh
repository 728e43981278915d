#!/usr/bin/env bash
# Session 10, device call 1: the layer benchmark re-measured with the whole fwd+bwd step
# (sonic_jax.bench.runner.fwdbwd_step returns the output as well as the gradients), pallas and
# ffi backends and the dense ceiling, on the 12 paper configs and the 4 presets.
#   run(command="bash scripts/h200_s10_bench.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_bench_out}
begin_call
BACKENDS=${BACKENDS:-pallas,ffi} BASELINES=${BASELINES:-dense-ceiling} \
  layer_bench "${TOTAL_S:-580}" "${BENCH_TAG:-s10}" ${CONFIGS:-paper presets}
echo "== [$(since) s] done"
