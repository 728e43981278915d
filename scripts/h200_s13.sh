#!/usr/bin/env bash
# Next device call (prepared in session 12, not yet run):
#   1. GPU test of FfiKernels(dw1_last=True) (bit for bit against the default);
#   2. memory_report.py (compile only): pallas at Qwen3-30B-A3B (1.001x the original SonicMoE in
#      session 11's row, before session 12's dx_pairs-after-dW2 barrier), and ffi against
#      ffi:dw1-last where the forward's gathered x may live to dW1 (paper-30B-n256: ffi 10.54
#      against pallas 6.54 GiB);
#   3. kernel_profile.py: what dw1-last costs the ffi step (the re-gather of x; PROF_ROUNDS=3);
#   4. the pallas layer benchmark of the configs not re-measured with session 12's final code.
#   run(command="bash scripts/h200_s13.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
# Build the library first on the CPU machine: python -m sonic_jax.ffi.build
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s13_out}
begin_call
gpu_tests "${TEST_S:-60}" tests/test_ffi.py -k "dw1_last"
memory_report "${MEM_S:-100}" 6 qwen3-30b-a3b,paper-30B-n256,paper-120B-n1024 pallas,ffi,ffi:dw1-last
kernel_profile "${PROF_S:-90}" paper-30B-n256,paper-120B-n1024 ffi,ffi:dw1-last 0.3
layer_bench "${TOTAL_S:-570}" "${BENCH_TAG:-s13}" ${CONFIGS:-paper-7B-n1024 qwen3-30b-a3b \
  paper-30B-n256 paper-120B-n512 olmoe-1b-7b deepseek-v3-like mixtral-8x7b}
echo "== [$(since) s] done"
