#!/usr/bin/env bash
# Session 22: Nsight Compute source view (SASS, per-instruction warp stall samples) of kind 10's
# dW2 (config 8) at the 120B-n1024 shape, to find where its warps wait.
#   run(command="bash scripts/h200_s22g.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s22g_out}
begin_call
cfg=${NCU_CONFIG:-32768,4096,1024,128,8}
echo "== [$(since) s] ncu source $cfg"
timeout "${NCU_S:-150}" ncu --clock-control none --section WarpStateStats --section SourceCounters \
  -k "regex:gather_wgrad" --launch-skip "${NCU_SKIP:-1}" --launch-count 1 -o "$OUT/k10" \
  $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 1 --variants gather > "$OUT/ncu-run.log" 2>&1
tail -3 "$OUT/ncu-run.log"
ncu --import "$OUT/k10.ncu-rep" --page source --print-source sass --csv > "$OUT/k10-sass.csv" 2>&1
ncu --import "$OUT/k10.ncu-rep" --page details > "$OUT/k10-details.txt" 2>&1
head -3 "$OUT/k10-sass.csv" | cut -c1-400; wc -l "$OUT/k10-sass.csv"
echo "== [$(since) s] done"
