#!/usr/bin/env bash
# Session 10, device call 4: dh_config_for picks the wide ring kernel with 6 stages of block_k 32
# at d >= 4096, n % 256 == 0 (gather="xla").
#   1. the layer benchmark (whole fwd+bwd step) of the configs whose dh changed;
#   2. the ffi GPU suite (its bf16 dW tolerance changed in session 7 without a GPU re-run);
#      needs sonic_jax/ffi/libsonic_jax_cuda.so carried.
#   run(command="bash scripts/h200_s10_final.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_final_out}
begin_call
layer_bench "${BENCH_S:-230}" "${BENCH_TAG:-s10-final}" \
  ${CONFIGS:-paper-30B-n1024 paper-120B-n1024 paper-120B-n2048 deepseek-v3-like mixtral-8x7b}
echo "== [$(since) s] ffi GPU tests"
timeout "${FFI_S:-200}" $PY -m pytest -q -rf -m gpu tests/test_ffi.py > "$OUT/ffi-gpu-tests.log" 2>&1
tail -n 8 "$OUT/ffi-gpu-tests.log"
echo "== [$(since) s] done"
