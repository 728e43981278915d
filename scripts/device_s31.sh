#!/usr/bin/env bash
# Session 31's device calls (carry the built library, ABI 14: sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=swiglu (any Hopper GPU): up_proj's SwiGLU in the epilogue of config 14's TMA GEMM over
#   the gathered copy of x (FfiKernels(up_proj_epilogue="gemm"), not yet run on a GPU): its GPU
#   tests, then the kernel profile of the step against the defaults.
#   run(command="PART=swiglu bash scripts/device_s31.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# PART=ncuswiglu (any Hopper GPU): Nsight Compute on config 14's plain up_proj GEMM (H) and its
#   SwiGLU one (H and A), P = 262144, K = 4096, 2n = 1024 (paper-30B-n512): why the SwiGLU
#   epilogue costs ~0.5 ms there (reports in $OUT/ncu-*.txt).
# PART=dhregs (any Hopper GPU): the dSwiGLU epilogue's consumers with 224 registers by setmaxnreg
#   and 8-pair H loads (kRegRealloc, not yet run on a GPU): the GPU tests of the dSwiGLU kernels
#   and entry points, then the kernel profile of fused_epilogue="dh" against the defaults (call 2
#   of session 31: its kernel 4.268 / 1.251 ms at 30B-n512 / 7B-n256 against 3.178 / 0.582 for
#   the separate kernels).
# PART=auto: the layer benchmark (scripts/device_s29.sh bench) on an H200, swiglu elsewhere.
# PART=next (session 32's first call): on an H200 the layer benchmark; elsewhere dhregs, then
#   ncuswiglu.
# PART=bench|epi|ncu|dhprof|...: as scripts/device_s30.sh.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s31_out}
begin_call
for part in ${PART//,/ }; do
if [[ $part == auto ]]; then
  grep -q H200 "$OUT/gpu.txt" && part=bench || part=swiglu
fi
if [[ $part == next ]]; then
  grep -q H200 "$OUT/gpu.txt" && part=bench || part="dhregs ncuswiglu"
fi
for part in $part; do
case $part in
swiglu)
  gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "in_order_swiglu or \
fused_epilogue_entry_points or (test_layer_forward_backward and up_proj_epilogue_gemm)"
  PROF_TAG=swiglu kernel_profile "${PROF_S:-240}" \
    "${PROF_CONFIGS:-paper-30B-n512,paper-7B-n256,paper-120B-n1024}" \
    "ffi,ffi:up_proj_epilogue=gemm" 0.05
  ;;
dhregs)
  gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "fused_epilogue_kernels or \
fused_epilogue_entry_points or (test_layer_forward_backward and (fused_dh or fused_epilogue))"
  PROF_TAG=dhregs kernel_profile "${PROF_S:-200}" "${PROF_CONFIGS:-paper-30B-n512,paper-7B-n256}" \
    "ffi,ffi:fused_epilogue=dh" 0.05
  ;;
ncuswiglu)
  NCU_SHAPE=262144,4096,1024,128 NCU_RUNS="VARLEN_M_NN_BF16:TMA_AB_128x256_C1:gather_gemm_kernel \
VARLEN_M_GATHER_SWIGLU:TMA_AB_128x256_C1:gather_gemm_kernel" OUT=$OUT PART=ncu \
    bash scripts/device_s30.sh | grep -v "^== \[.*\] done"
  ;;
*)
  OUT=$OUT PART=$part BENCH_TAG=${BENCH_TAG:-s31} bash scripts/device_s30.sh \
    | grep -v "^== \[.*\] done"
  ;;
esac
done
done
echo "== [$(since) s] done"
