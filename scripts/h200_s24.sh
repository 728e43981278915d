#!/usr/bin/env bash
# Next device calls (prepared in session 24, which had no device time; carry the built library).
# PART=kernels (default):
#   GPU tests of every kind-10 schedule incl. config 9 (GATHER_TMA_256x128_C1, built in
#   session 22-23, never run on a GPU) and of backend='auto' by shape and dtype (session 24);
#   dW1 / dW2 alone per schedule (config 8 'gather', config 9 'nocluster', gather_rows +
#   CUTLASS 'plain') at three shapes.
# PART=bench (an H200 only: the README table is H200-only): the ffi layer benchmark of the two
#   presets whose rows are still session 12's (DeepSeek-V3-like 1.008x, Mixtral 1.061x the
#   original).
# PART=mix: the step per kernel of ffi with pallas' dW1 / dW2 (different calls measured pallas'
#   15.5 / 7.2 ms against ffi's 16.2 / 8.2 at DeepSeek-V3-like): if a mix wins in one call,
#   backend='auto' can return it for those shapes.
# PART=dx: benchmarks/dx_add.py at the two configs where the pallas step is 0.988-0.993x the
#   paper (7B-n256, 1.4B-n512): is the router's x-gradient add (about 1.5 % of those steps)
#   folded into the dx GEMM, with or without cuBLASLt? (Session 25, H100: no, a separate add
#   fusion; the barrier variant was dropped: benchmarks/results/s25-h100-2026-12-06.md.)
#   run(command="PART=kernels bash scripts/h200_s24.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s24_out}
begin_call
PART=${PART:-kernels}
for part in ${PART//,/ }; do  # PART=kernels,bench runs both in one call
case $part in
kernels)
  gpu_tests "${TEST_S:-150}" tests/test_ffi.py tests/test_backends.py \
    -k "gathered_varlen_k or auto"
  wgrad_times 70 "${TIME_VARIANTS:-gather,nocluster,plain}" \
    ${TIME_CONFIGS:-32768,4096,1024,128,8 32768,4096,256,256,16 40960,768,256,128,8}
  ;;
bench)
  if grep -q H200 "$OUT/gpu.txt"; then
    BACKENDS=ffi layer_bench "${TOTAL_S:-560}" "${BENCH_TAG:-s24-ffi-presets}" \
      DeepSeek-V3-like Mixtral-8x7B
  else
    echo "not an H200: the preset rows of the README table are H200 rows; skipped"
  fi
  ;;
mix)
  PROF_TAG=mix kernel_profile "${PROF_S:-500}" \
    "${MIX_CONFIGS:-DeepSeek-V3-like,paper-120B-n1024}" \
    "ffi,ffi+dw1/dw2=pallas,ffi+dw2=pallas,pallas" 0.1
  ;;
dx)
  for flags in "" "--xla_gpu_enable_cublaslt=true"; do
    for cfg in paper-7B-n256 paper-1.4B-n512; do
      log=$OUT/dx-$cfg${flags:+-cublaslt}.txt
      echo "== [$(since) s] dx add $cfg ${flags}"
      hlo=()  # the optimized HLO of the first config only (a few MB per variant)
      [[ $cfg == paper-7B-n256 ]] && hlo=(--hlo-dir "$OUT/hlo${flags:+-cublaslt}")
      XLA_FLAGS=$flags timeout "${DX_S:-120}" $PY benchmarks/dx_add.py --config "$cfg" \
        --backends pallas,ffi "${hlo[@]}" > "$log" 2>&1
      tail -n 6 "$log" | cut -c1-200
    done
  done
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
