#!/usr/bin/env bash
# Session 12, device call 3:
#   1. GPU tests of the in-kernel-gather dh on the row-split tile at d = 768 and 1536 (the new
#      dh_config_for(gather="fused") default at n % 256 == 0) against the xla backend, and the
#      layer gradients at d = 1024, n = 256 (which now runs it);
#   2. kernel_profile.py, pallas (the dispatch-fed kernels at n >= 512 below d = 4096) against
#      pallas:fused (in-kernel gathers everywhere, now with the row-split dh): whether "auto"
#      can take the in-kernel gathers, which hold less memory (memory-report s12: paper-1.4B-n512
#      0.964 against 1.197 GiB; the original SonicMoE 1.063);
#   3. kernel_profile.py at DeepSeek-V3-like (one call per round: its outputs are 23 GiB), with
#      up_proj fed by the dispatch.
#   run(command="bash scripts/h200_s12c.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12c_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py -k "small_d or (gpu_layer_gradients and shape1)"
echo "== [$(since) s] kernel profile (gathers)"
timeout "${PROF1_S:-260}" $PY benchmarks/kernel_profile.py --out-dir "$OUT/pg" --iters 5 --rounds 2 \
  --configs "${PROF_CONFIGS:-paper-1.4B-n512,paper-1.4B-n1024,paper-7B-n1024,olmoe-1b-7b,paper-120B-n1024}" \
  --variants "pallas,pallas:fused" --min-ms 0.1 > "$OUT/profile-gathers.log" 2>&1
grep -E "^==|^  (pallas|xla)|^  --|Error|failed" "$OUT/profile-gathers.log" | cut -c1-150
echo "== [$(since) s] kernel profile (DeepSeek-V3-like)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 timeout "$(( ${TOTAL_S:-560} - $(since) ))" \
  $PY benchmarks/kernel_profile.py --out-dir "$OUT/pds" --iters 5 --rounds 3 \
  --configs deepseek-v3-like --variants "pallas,pallas::up_proj.gather=xla:up_proj.cross_tile=true" \
  --min-ms 0.3 > "$OUT/profile-deepseek.log" 2>&1
grep -E "^==|^  (pallas|xla)|^  --|^  [0-9]+ calls|body|fusion|Error|failed" "$OUT/profile-deepseek.log" | cut -c1-150
echo "== [$(since) s] done"
