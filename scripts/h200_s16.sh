#!/usr/bin/env bash
# Session 16, device call 1: the ffi backend's fused SwiGLU / dSwiGLU epilogues
# (FfiKernels(fused_epilogue=True), csrc/gather_gemm.cuh, ABI 5).
#   1. the ffi GPU tests of the fused epilogues (fp64 reference, unfused kernels, xla backend,
#      determinism, no live rows) and of the gathered kinds (the header they share changed),
#      then the layer forward+backward against xla for every FfiKernels variant;
#   2. `python -m sonic_jax.ffi.sweep --fused-epilogue-only`: up_proj, dh and the layer with
#      the epilogues separate and fused, at two shapes.
# Build the library first on the CPU machine (python -m sonic_jax.ffi.build), then
#   run(command="bash scripts/h200_s16.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s16_out}
begin_call
gpu_tests "${TEST_S:-260}" tests/test_ffi.py -k "${TEST_K:-fused_epilogue or gathered or layer_forward_backward or forward_entry or backward_entry}"
echo "== [$(since) s] fused-epilogue sweep"
timeout "${SWEEP_S:-250}" $PY -m sonic_jax.ffi.sweep --fused-epilogue-only --iters 10 \
  --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 24576,1536,256,128,8} \
  --json "$OUT/fused-epilogue-sweep.json" > "$OUT/fused-epilogue-sweep.log" 2>&1
grep -E "config T=|\[|rror" "$OUT/fused-epilogue-sweep.log" | cut -c1-150
echo "== [$(since) s] done"
