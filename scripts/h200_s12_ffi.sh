#!/usr/bin/env bash
# Next device call for the ffi backend (prepared in session 11, not yet run): its CUDA
# scatter_rows (FfiKernels(row_gather="scatter")) against gather_rows.
#   1. the ffi GPU tests of the scatter (bit for bit against gather_rows; the layer's gradients
#      with it bit for bit against the default) and the layer tests;
#   2. dispatch_bench.py: XLA's gather, the Triton scatter and the ffi gather / scatter.
# Build the library first on the CPU machine (ABI 4 since session 11):
#   python -m sonic_jax.ffi.build
#   run(command="bash scripts/h200_s12_ffi.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=400)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12_ffi_out}
begin_call
gpu_tests "${TEST_S:-200}" tests/test_ffi.py -k "scatter or layer_forward_backward"
echo "== [$(since) s] dispatch bench"
timeout "${DISP_S:-150}" $PY benchmarks/dispatch_bench.py --out-dir "$OUT" \
  --configs "${DISP_CONFIGS:-paper-120B-n1024,OLMoE-1B-7B,Mixtral-8x7B}" \
  --variants "xla,jax_triton:scatter:1x2048:w4,pallas_triton:scatter:1x2048:w4,ffi:gather,ffi:scatter" \
  > "$OUT/dispatch.log" 2>&1
grep -E "^==|^  [a-z_:0-9x-]+ +[0-9.]+ ms|rror" "$OUT/dispatch.log" | cut -c1-150
echo "== [$(since) s] done"
