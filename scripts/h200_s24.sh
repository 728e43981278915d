#!/usr/bin/env bash
# Next device call (prepared in session 24, which had no device time; carry the built library):
# 1. GPU tests: every kind-10 schedule incl. config 9 (GATHER_TMA_256x128_C1, built in session
#    22-23, never run on a GPU) and backend='auto' by shape and dtype (session 24);
# 2. dW1 / dW2 alone per schedule (config 8 'gather', config 9 'nocluster', gather_rows +
#    CUTLASS 'plain') at three shapes;
# 3. on an H200 only (the README table is H200-only): the ffi layer benchmark of the two presets
#    whose rows are still session 12's (DeepSeek-V3-like 1.008x, Mixtral 1.061x the original).
#   run(command="bash scripts/h200_s24.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s24_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py tests/test_backends.py \
  -k "gathered_varlen_k or auto"
wgrad_times 70 "${TIME_VARIANTS:-gather,nocluster,plain}" \
  ${TIME_CONFIGS:-32768,4096,1024,128,8 32768,4096,256,256,16 40960,768,256,128,8}
if grep -q H200 "$OUT/gpu.txt" && [[ ${BENCH:-1} != 0 ]]; then
  BACKENDS=ffi layer_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s24-ffi-presets}" \
    DeepSeek-V3-like Mixtral-8x7B
fi
echo "== [$(since) s] done"
