#!/usr/bin/env bash
# Session 13, device call 3, with the new defaults (dh's swizzled epilogue on the row-split ring
# tiles and, at d < 1536, the 128 x 128 SMEM-H ring tile; down_proj / dx_pairs' swizzled
# epilogue at k <= 2048):
#   1. GPU tests: dh (default, swizzled variants, in-kernel gather at small d), the forward
#      (down_proj / dx_pairs' ring) against xla, the layer gradients against the float32 reference at three shapes;
#   2. memory_report.py: ffi against ffi:dw1-last at paper-30B-n256 (call 1's report ran out
#      of time after its first config);
#   3. the pallas layer benchmark on the 12 paper configs, then the other four.
#   run(command="bash scripts/h200_s13c.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s13c_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_pallas_backward.py \
  -k "gpu_dh_matches or swizzled_epilogue or small_d or layer_gradients"
echo "== [$(since) s] forward GPU tests"
timeout "${FWD_S:-80}" $PY -m pytest -q -rA -m gpu tests/test_pallas_forward.py \
  -k "gpu_cross_tile or (gpu_forward_matches_xla and fused)" > "$OUT/gpu-tests-forward.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu-tests-forward.log" | head -n 8 | cut -c1-200
memory_report "${MEM_S:-70}" 6 paper-30B-n256 ffi,ffi:dw1-last
layer_bench "${TOTAL_S:-575}" "${BENCH_TAG:-s13-final}" ${CONFIGS:-paper-1.4B-n256 \
  paper-1.4B-n512 paper-1.4B-n1024 paper-7B-n256 paper-7B-n512 paper-7B-n1024 paper-30B-n256 \
  paper-30B-n512 paper-30B-n1024 paper-120B-n512 paper-120B-n1024 paper-120B-n2048 \
  olmoe-1b-7b qwen3-30b-a3b mixtral-8x7b deepseek-v3-like}
echo "== [$(since) s] done"
