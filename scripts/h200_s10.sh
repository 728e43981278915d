#!/usr/bin/env bash
# Next device call (prepared in session 9, not yet run):
#   1. the marked GPU tests of dh, among them the two-consumer ring kernels (DhConfig(
#      num_consumers=2), fused and TMA-fed), against the default kernel and the xla backend;
#   2. kernel_profile.py, the default against dh on the two-consumer TMA-fed ring and against
#      dh with two CTAs per SM (the default at d <= 1536 since session 9) at d = 2048 and 4096;
#   3. the ffi GPU suite (its bf16 dW tolerance was changed in session 7 without a GPU re-run);
#      needs sonic_jax/ffi/libsonic_jax_cuda.so carried.
#   run(command="bash scripts/h200_s10.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_pallas_backward.py -k "gpu_dh"
TWO_CTA=dh.block_n=64:dh.epi_n=64:dh.max_concurrent_steps=3:dh.ctas_per_sm=2
kernel_profile "${PROF_S:-240}" \
  "${PROF_CONFIGS:-paper-30B-n1024,paper-120B-n1024,olmoe-1b-7b,qwen3-30b-a3b}" \
  "pallas,pallas::dh-ring:dh.num_consumers=2,pallas::$TWO_CTA" 0.3
echo "== [$(since) s] ffi GPU tests"
timeout "${FFI_S:-180}" $PY -m pytest -q -rf -m gpu tests/test_ffi.py > "$OUT/ffi-gpu-tests.log" 2>&1
tail -n 6 "$OUT/ffi-gpu-tests.log"
echo "== [$(since) s] done"
