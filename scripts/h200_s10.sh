#!/usr/bin/env bash
# Next device call (prepared in session 9, not yet run):
#   1. kernel_profile.py at d = 2048 (OLMoE, Qwen3): does dh's two-CTAs-per-SM tiling (the
#      default at d <= 1536 since session 9) also win there?
#   2. the ffi GPU suite (its bf16 dW tolerance was changed in session 7 without a GPU re-run);
#      needs sonic_jax/ffi/libsonic_jax_cuda.so carried.
#   run(command="bash scripts/h200_s10.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s10_out}
begin_call
TWO_CTA=dh.block_n=64:dh.epi_n=64:dh.max_concurrent_steps=3:dh.ctas_per_sm=2
echo "== [$(since) s] kernel profile"
timeout "${PROF_S:-150}" $PY benchmarks/kernel_profile.py --out-dir "$OUT" --iters 10 \
  --configs "${PROF_CONFIGS:-olmoe-1b-7b,qwen3-30b-a3b}" \
  --variants "pallas,pallas::$TWO_CTA" --min-ms 0.3 2>&1 | tee "$OUT/profile.log" \
  | grep -E "^==|^  (pallas|xla)|^  --|body_|Error" | cut -c1-150
echo "== [$(since) s] ffi GPU tests"
timeout "${FFI_S:-200}" $PY -m pytest -q -rf -m gpu tests/test_ffi.py > "$OUT/ffi-gpu-tests.log" 2>&1
tail -n 6 "$OUT/ffi-gpu-tests.log"
echo "== [$(since) s] done"
