#!/usr/bin/env bash
# Next device call (prepared in session 11, not yet run):
#   1. GPU tests session 11 could not finish in its step limits: the dispatch kernels, the
#      layer gradients at d = 4096 (row-split dh + dispatch defaults; bit for bit against XLA's
#      gathers), the fused dh on the row-split tile against the xla backend;
#   2. the layer benchmark of the five configs whose backward gathers inside the kernels (the
#      fused dh moved to the row-split tile in session 11; their rows are still session 10's);
#   3. kernel_profile.py: DeepSeek-V3-like (the one config below the original SonicMoE), and
#      up_proj fed by the dispatch (gather="xla" on the across-tiles ring) against its in-kernel
#      cp.async gather at 120B-n1024 and 30B-n512.
#   run(command="bash scripts/h200_s12.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12_out}
begin_call
gpu_tests "${TEST_S:-240}" tests/test_triton.py tests/test_pallas_backward.py \
  -k "gpu_dispatch or (gpu_layer_gradients and shape2) or fused-rows-wide"
layer_bench "${BENCH_END_S:-400}" "${BENCH_TAG:-s12-fused}" \
  ${CONFIGS:-paper-120B-n512 paper-30B-n512 paper-30B-n256 paper-7B-n256 paper-1.4B-n256}
UPX=up_proj.gather=xla:up_proj.cross_tile=true
kernel_profile "$(( ${TOTAL_S:-580} - $(since) ))" \
  "${PROF_CONFIGS:-deepseek-v3-like,paper-120B-n1024,paper-30B-n512}" "pallas,pallas::$UPX" 0.3
echo "== [$(since) s] done"
