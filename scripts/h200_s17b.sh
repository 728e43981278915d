#!/usr/bin/env bash
# Prepared in session 17, call 2 after scripts/h200_s17.sh (whose tests must pass first):
# 1. `sonic_jax.ffi.sweep --fused-epilogue-only` at 120B-n1024 and 7B-n256: up_proj, dh and
#    the layer with the epilogues separate, fused with the weights by cp.async, and fused with
#    them by TMA multicast (gather_b="tma"), and each schedule of the two fused kernels;
# 2. the layer benchmark of the ffi backend as it then is on all 16 configs, time permitting
#    (make dswiglu="warp" and / or gather_b="tma" defaults first if call 1 found them faster).
#   run(command="bash scripts/h200_s17b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s17b_out}
begin_call
echo "== [$(since) s] fused-epilogue sweep"
timeout "${SWEEP_S:-240}" $PY -m sonic_jax.ffi.sweep --fused-epilogue-only --iters 10 \
  --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 24576,1536,256,128,8} \
  --json "$OUT/fused-epilogue-sweep.json" > "$OUT/fused-epilogue-sweep.log" 2>&1
grep -E "config T=|\[|rror" "$OUT/fused-epilogue-sweep.log" | cut -c1-150
BACKENDS=${BACKENDS:-ffi} layer_bench "${TOTAL_S:-565}" s17-ffi paper-1.4B-n256 paper-7B-n256 \
  paper-30B-n256 paper-1.4B-n512 paper-7B-n512 paper-30B-n512 paper-120B-n512 paper-1.4B-n1024 \
  paper-7B-n1024 paper-30B-n1024 paper-120B-n1024 paper-120B-n2048 qwen3-30b-a3b olmoe-1b-7b \
  mixtral-8x7b deepseek-v3-like
echo "== [$(since) s] done"
