#!/usr/bin/env bash
# Session 37's device calls beyond scripts/device_s36.sh's parts (which ran in session 37):
#   run(command="PART=autobench bash scripts/device_s37.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"], kind="nvidia-h200")
# autobench: auto's new first choice at n <= 256, "pallas+ffi" (the pallas forward with the ffi
#   backward): the GPU test of auto's choices (forward and gradients against xla), then the layer
#   benchmark of pallas, ffi and pallas+ffi at the n = 256 paper configs (an H200 for the README).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s37_out}
begin_call
for part in ${PART//,/ }; do
case $part in
autobench)
  gpu_tests "${TEST_S:-150}" tests/test_backends.py -k "gpu_auto"
  tail -n 3 "$OUT/gpu-tests.log" | cut -c1-200
  BACKENDS=${BACKENDS:-pallas,ffi,pallas+ffi} layer_bench "${BENCH_S:-330}" s37-autobench \
    ${BENCH_CONFIGS:-paper-1.4B-n256 paper-7B-n256 paper-30B-n256}
  ;;
*)
  echo "unknown part $part"
  ;;
esac
done
echo "== [$(since) s] done"
