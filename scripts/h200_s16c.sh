#!/usr/bin/env bash
# Session 16, device call 3: where the fused dSwiGLU epilogue pays. GPU tests of the fused
# epilogues (after FfiKernels(fused_epilogue=...) became a mode), then the per-kernel profile of
# the layer step, fused_epilogue "none" against "dh", variants interleaved, at n = 256 and 512.
#   run(command="bash scripts/h200_s16c.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s16c_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "${TEST_K:-fused_epilogue}"
PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-330}" \
  "${PROF_CONFIGS:-paper-1.4B-n256,paper-7B-n256,paper-30B-n256,paper-7B-n512,paper-120B-n512}" \
  "ffi:fused_epilogue=none,ffi:fused_epilogue=dh" 0.05
echo "== [$(since) s] done"
