#!/usr/bin/env bash
# Session 20, call 2 (carry the built library): the kind-10 GPU tests that call 1's 120 s did
# not finish, then the layer benchmark of the ffi backend with the warp-per-row dSwiGLU now the
# default, at the configs where it counts (n <= 512).
#   run(command="bash scripts/h200_s20b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s20b_out}
begin_call
gpu_tests "${TEST_S:-110}" tests/test_ffi.py -k "gathered_varlen_k"
BACKENDS=ffi layer_bench "${TOTAL_S:-430}" "${BENCH_TAG:-s20-ffi}" ${CONFIGS:-paper-30B-n256 \
  paper-1.4B-n256 paper-7B-n256 paper-120B-n512 paper-30B-n512 paper-1.4B-n512 paper-7B-n512}
echo "== [$(since) s] done"
