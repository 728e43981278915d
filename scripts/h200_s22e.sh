#!/usr/bin/env bash
# Session 22, fifth call: the layer benchmark of the ffi backend with its new default
# (fused_gather / wgrad_gather "auto": the dO path in the GEMM where n <= 256) at the paper
# configs it changes -> bench-h200-2026-12-05-s22-ffi.json.
#   run(command="bash scripts/h200_s22e.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22e_out}
begin_call
BACKENDS=ffi layer_bench "${TOTAL_S:-420}" "${BENCH_TAG:-s22-ffi}" \
  ${CONFIGS:-paper-1.4B-n256 paper-7B-n256 paper-30B-n256}
echo "== [$(since) s] done"
