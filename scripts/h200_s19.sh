#!/usr/bin/env bash
# Session 19, call 1 (carry the built library):
# 1. GPU tests: the new gathered varlen-K kernel (dW1 / dW2 reading x / dO rows through
#    gather_idx) against float64, and the layer forward+backward of the ffi backend's variants
#    against xla, wgrad_gather, the MixedKernels mixes (pallas + ffi) and dswiglu="warp" included;
# 2. `sonic_jax.ffi.sweep --elementwise-only`: the dSwiGLU kernel a block per row against a warp
#    per row (and SwiGLU) at six paper shapes, GB/s against a copy of the same bytes;
# 3. per-kernel profile of the ffi step at the three n = 256 configs and 120B-n1024: dswiglu
#    block against warp, and the gathered weight gradients (alone and with the fused gather);
# then scripts/h200_s19b.sh (the mixes and memcheck) in the next call.
#   run(command="bash scripts/h200_s19.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s19_out}
begin_call
gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "gathered_varlen_k or layer_forward_backward"
(( ${EW_S:-90} > 0 )) && ffi_sweep "${EW_S:-90}" elementwise "dswiglu|swiglu_from|copy|config T=" --elementwise-only \
  --configs 40960,768,256,128,8 24576,1536,256,128,8 32768,4096,256,256,16 \
  24576,1536,512,64,4 32768,4096,1024,128,8 32768,4096,2048,64,4
PROF_TAG=ffi kernel_profile "${PROF_S:-200}" \
  "paper-1.4B-n256,paper-7B-n256,paper-30B-n256,paper-120B-n1024" \
  "ffi,ffi:dswiglu=warp,ffi:wgrad-gather,ffi:fused-gather:wgrad-gather,ffi:fused_epilogue=both:wgrad-gather" 0.05
echo "== [$(since) s] done"
