#!/usr/bin/env bash
# Session 12, device call 4:
#   1. memory_report.py (compile only) with dx_pairs ordered after dW2 (experts.py barrier) at
#      the two configs over the original SonicMoE's memory (session 12 call 2: paper-1.4B-n512
#      1.197, -n1024 0.962 GiB against 1.063 / 0.94) and paper-7B-n512;
#   2. the pallas layer benchmark of the configs this session's changes touch: the row-split
#      in-kernel-gather dh at n = 256 (paper-1.4B-n256, -7B-n256) and the barrier (paper-1.4B-n512,
#      -1.4B-n1024, -7B-n512);
#   3. the ffi layer benchmark on all 16 configs with scatter_rows, its new default row maker;
#   4. kernel_profile.py at DeepSeek-V3-like (one call per round), with up_proj fed by the dispatch.
#   run(command="bash scripts/h200_s12d.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12d_out}
begin_call
echo "== [$(since) s] memory report"
timeout "${MEM_S:-70}" $PY benchmarks/memory_report.py --out-dir "$OUT/mem" --rows 6 \
  --configs paper-1.4B-n512,paper-1.4B-n1024,paper-7B-n512 --variants pallas > "$OUT/memory-report.log" 2>&1
grep -E "^== " "$OUT/memory-report.log" | cut -c1-170
rm -rf "$OUT/mem/xla_dump"
layer_bench "$(( $(since) + ${PALLAS_S:-130} ))" s12 \
  paper-1.4B-n256 paper-7B-n256 paper-1.4B-n512 paper-1.4B-n1024 paper-7B-n512
BACKENDS=ffi layer_bench "$(( $(since) + ${FFI_S:-190} ))" s12-ffi paper presets
echo "== [$(since) s] kernel profile (DeepSeek-V3-like)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 timeout "$(( ${TOTAL_S:-540} - $(since) ))" \
  $PY benchmarks/kernel_profile.py --out-dir "$OUT/pds" --iters 5 --rounds 3 \
  --configs deepseek-v3-like --variants "pallas,pallas::up_proj.gather=xla:up_proj.cross_tile=true" \
  --min-ms 0.3 > "$OUT/profile-deepseek.log" 2>&1
grep -E "^==|^  (pallas|xla)|^  --|^  [0-9]+ calls|body|fusion|Error|failed" "$OUT/profile-deepseek.log" | cut -c1-150
echo "== [$(since) s] done"
