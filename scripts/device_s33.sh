#!/usr/bin/env bash
# Session 33's device calls (carry the built library, ABI 14: sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=upfused (any Hopper GPU): the x path with no gathered copy of x at all, at the n = 256
#   configs where the step is 5-9 % short of the paper's H100 figures: up_proj's gather and
#   SwiGLU in one kernel (fused_epilogue="up_proj", 0.731 against 0.843 ms for scatter + GEMM +
#   swiglu_from_h at 7B-n256, session 31) with dW1 reading x through the gather index
#   (wgrad_gather; session 22's kernel 10), against the defaults and against every gather in
#   the GEMM (session 22's "every gather", 4.095 against 4.074 ms at 7B-n256 on the H100).
#   run(command="PART=upfused bash scripts/device_s33.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# PART=auto (session 34's first call): on an H200 the layer benchmark (PART=bench), elsewhere
#   upfused.
# PART=xtests (any Hopper GPU): session 34's default (up_proj and dW1 read x through the gather
#   index where n <= 256, backend.x_in_gemm): the ffi entry points with the defaults and with
#   every operand scattered, and the layer forward+backward against xla.
# PART=pingpong|pallaspp|...: as scripts/device_s32.sh.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s33_out}
begin_call
UPFUSED_VARIANTS=${UPFUSED_VARIANTS:-"ffi,ffi:fused_epilogue=up_proj:wgrad-gather,\
ffi:fused_epilogue=up_proj:wgrad-gather:gather_schedule=tma_b_c1,ffi:fused-gather:wgrad-gather"}
for part in ${PART//,/ }; do
if [[ $part == auto ]]; then
  grep -q H200 "$OUT/gpu.txt" && part=bench || part=upfused
fi
case $part in
xtests)
  gpu_tests "${TEST_S:-240}" tests/test_ffi.py -k "entry_points_match_xla or \
test_layer_forward_backward_matches_xla or scatter_rows_match or dw1_last"
  tail -n 2 "$OUT/gpu-tests.log" | cut -c1-200
  ;;
upfused)
  PROF_TAG=upfused kernel_profile "${PROF_S:-420}" \
    "${PROF_CONFIGS:-paper-7B-n256,paper-1.4B-n256}" "${UPFUSED_VARIANTS}" 0.05
  grep -E "ms  |--|^ +[0-9]+ +[0-9.]+ " "$OUT/profile-upfused.log" | cut -c1-150 | head -n 90
  ;;
*)
  OUT=$OUT PART=$part bash scripts/device_s32.sh | grep -v "^== \[.*\] done"
  ;;
esac
done
echo "== [$(since) s] done"
