#!/usr/bin/env bash
# Session 11, device call 2: the Triton row dispatch against XLA's gather, and dh's row-split
# tile beyond d >= 2048.
#   1. GPU tests: sonic_jax.triton.dispatch bit for bit against x[gather_idx] (both impls and
#      methods), and the layer's gradients (the new dh default at d = 4096; with
#      PallasKernels(row_gather=...) bit for bit against XLA's gathers);
#   2. benchmarks/dispatch_bench.py: XLA's gather, its uint32 view, a copy, the dispatch kernels;
#   3. kernel_profile.py, variants taking turns: row_gather=jax_triton against XLA's gathers; the
#      row-split dh tile at d <= 1536 against the two-CTA default; two deeper rings at d = 4096.
#   run(command="bash scripts/h200_s11b.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s11b_out}
begin_call
gpu_tests "${TEST_S:-170}" tests/test_triton.py tests/test_pallas_backward.py \
  -k "gpu_dispatch or gpu_layer_gradients"
echo "== [$(since) s] dispatch bench"
timeout "${DISP_S:-120}" $PY benchmarks/dispatch_bench.py --out-dir "$OUT" \
  --configs "${DISP_CONFIGS:-paper-120B-n1024,OLMoE-1B-7B,paper-1.4B-n512,Mixtral-8x7B}" \
  > "$OUT/dispatch.log" 2>&1
grep -E "^==|^  [a-z_:0-9x-]+ +[0-9.]+ ms|rror" "$OUT/dispatch.log" | cut -c1-150
ROWS=dh.ring=true:dh.ctas_per_sm=1:dh.num_consumers=2:dh.consumer_split=m:dh.h_source=gmem
ROWS=$ROWS:dh.block_k=32:dh.max_concurrent_steps=6:dh.epi_buffers=2:dh.block_n=256:dh.epi_n=64
kernel_profile "${PROF_S:-290}" "${PROF_CONFIGS:-paper-1.4B-n512,paper-7B-n512}" \
  "pallas,pallas::$ROWS,pallas::row_gather=jax_triton" 0.3
cp "$OUT/profile.log" "$OUT/profile-small.log"; cp "$OUT/kernel_profile.json" "$OUT/kernel_profile-small.json"
kernel_profile "$(( ${TOTAL_S:-580} - $(since) ))" "${PROF_CONFIGS2:-paper-120B-n1024,OLMoE-1B-7B}" \
  "pallas,pallas::row_gather=jax_triton,pallas::dh.block_k=64:dh.max_concurrent_steps=3,pallas::dh.epi_buffers=1:dh.max_concurrent_steps=7" 0.3
echo "== [$(since) s] done"
