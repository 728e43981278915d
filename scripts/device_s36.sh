#!/usr/bin/env bash
# Session 36's device plan (none was lent in session 36, so nothing here has run yet). Carry the
# built library, ABI 15, rebuilt after dad6449 (the weight-gradient kernel's stores):
#   run(command="PART=wgradstore bash scripts/device_s36.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# In order of what each call can change (each fits one 600 s call):
# 0. PART=wgradstore (any Hopper GPU; rebuild the library first): session 36 changed the weight-
#    gradient kernel's bf16 epilogue (gather_wgrad.cuh: whole-sector stores), which the default
#    runs for dW1 / dW2 where n <= 256 (dW2 also at n <= 512 with d <= 1024). Its GPU tests first (every gathered varlen-K schedule
#    against float64, determinism, config 14's varlen-K, the layer with the in-GEMM gathers),
#    then dW1 / dW2 alone at 120B-n512, 30B-n256 and 120B-n1024 (wgrad_kernels.py --time:
#    gather, nocluster, plain), then the step at 120B-n512 and 30B-n512 with every gather in
#    the GEMM against the default. Run this before anything else.
# 1. PART=mix: the pallas forward with the ffi backward, and ffi with pallas' up_proj, against
#    both backends (interleaved kernel profile at 7B-n256, 1.4B-n256, 120B-n512).
# 2. PART=ppc1: GemmConfig 18 / 19 (CUTLASS ping-pong without a cluster) GPU tests, then against
#    each kind's default at 120B-n512 and the n = 256 configs.
# 3. PART=dout512,power: dO read through gather_idx at n = 512, d >= 1536 against the default;
#    then the power trace (POWER_RUNS, two runs by default here).
# 4. PART=bench (an H200 only): the layer benchmark of the configs that miss a target, now with
#    each timing's SM clock, power and throttle reasons (the runner's GPU state, session 36).
# 5. PART=memcheck_new: compute-sanitizer memcheck of the kernel tests of what was built after
#    the last memcheck (session 23): TMA_AB (config 14), the ping-pong schedules (gathers of
#    session 32, plain 18 / 19 of session 35), the dSwiGLU warp-per-row and in-order SwiGLU
#    kernels, scatter_rows; one routing case per schedule (token rounding: padding rows, groups
#    straddling tiles). MC_K overrides the selection.
# 6. PART=tmagather (any Hopper GPU, seconds): benchmarks/cuda/tma_row_gather.cu, built with
#    nvcc: can one-row TMA boxes fill the gathered operand's swizzled stage (checked against
#    x[idx] first), and how fast against cp.async and in-order TMA tiles, with the rows in L2
#    (one expert's, 16 MiB) and from HBM? Whether the gathered operand could come by TMA once
#    the weight-gradient kernel's own gap to CUTLASS (config 14 without a gather is as slow) is
#    closed.
# Parts 1-3 are scripts/device_s35.sh's.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s36_out}
begin_call
for part in ${PART//,/ }; do
case $part in
power)
  POWER_RUNS=${POWER_RUNS:-"paper-30B-n256/pallas paper-120B-n512/ffi"} OUT=$OUT PART=power \
    bash scripts/device_s35.sh | grep -v "^== \[.*\] done" | grep -v ", MHz\|^NVIDIA"
  ;;
bench)
  BENCH_CONFIGS=${BENCH_CONFIGS:-"paper-7B-n256 paper-30B-n256 paper-120B-n512 paper-1.4B-n256"} \
    OUT=$OUT PART=bench bash scripts/device_s35.sh | grep -v "^== \[.*\] done"
  ;;
memcheck_new)
  memcheck_each "${MC_S:-540}" tests/test_ffi.py "${MC_K:-(every_gemm_schedule and (TMA_AB or \
PINGPONG_128x128_C1x1 or PINGPONG_64x256)) or (gathered_gemm_matches_fp32 and PINGPONG and \
token_rounding) or dswiglu_warp or in_order_swiglu or scatter_rows_matches}"
  ;;
wgradstore)
  gpu_tests "${TEST_S:-200}" tests/test_ffi.py -k "gathered_varlen_k or \
(every_gemm_schedule and VARLEN_K) or (layer_forward_backward and (gather or wgrad))"
  tail -n 2 "$OUT/gpu-tests.log" | cut -c1-200
  if grep -q " failed" "$OUT/gpu-tests.log"; then
    echo "wgradstore: GPU tests failed; not timing"
  else
    wgrad_times "${TIME_S:-60}" "${TIME_VARIANTS:-gather,nocluster,plain}" \
      32768,4096,512,256,16 32768,4096,256,256,16 32768,4096,1024,128,8
    PROF_TAG=wgradstore kernel_profile "${PROF_S:-180}" \
      "${PROF_CONFIGS:-paper-120B-n512,paper-30B-n512}" "ffi,ffi:fused-gather:wgrad-gather" 0.05
  fi
  ;;
tmagather)
  echo "== [$(since) s] tma_row_gather"
  nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/tma_row_gather benchmarks/cuda/tma_row_gather.cu \
    > "$OUT/tma_row_gather.log" 2>&1
  for window in 2048 32768; do
    timeout 60 /tmp/tma_row_gather 32768 4096 "$window" 4000 >> "$OUT/tma_row_gather.log" 2>&1
    echo "rc=$?" >> "$OUT/tma_row_gather.log"
  done
  cat "$OUT/tma_row_gather.log" | cut -c1-160 | tail -n 30
  ;;
*)
  OUT=$OUT PART=$part bash scripts/device_s35.sh | grep -v "^== \[.*\] done" \
    | grep -v ", MHz\|^NVIDIA"
  ;;
esac
done
echo "== [$(since) s] done"
