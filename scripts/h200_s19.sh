#!/usr/bin/env bash
# Session 19, call 1 (carry the built library):
# 1. GPU tests: the layer forward+backward of the ffi backend's variants against xla, the new
#    MixedKernels mixes (pallas + ffi entry points) and dswiglu="warp" included;
# 2. `sonic_jax.ffi.sweep --elementwise-only`: the dSwiGLU kernel a block per row against a warp
#    per row (and SwiGLU) at six paper shapes, GB/s against a copy of the same bytes;
# 3. per-kernel profile of the ffi step, dswiglu block against warp, at the three n = 256 configs;
# 4. per-kernel profile of the pallas step against mixes that take some entry points from ffi,
#    and pallas with dW1 on 2-CTA clusters (the one kernel session 18 saw gain from it).
#   run(command="bash scripts/h200_s19.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s19_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_ffi.py -k "test_layer_forward_backward_matches_xla"
ffi_sweep "${EW_S:-90}" elementwise "dswiglu|swiglu_from|copy|config T=" --elementwise-only \
  --configs 40960,768,256,128,8 24576,1536,256,128,8 32768,4096,256,256,16 \
  24576,1536,512,64,4 32768,4096,1024,128,8 32768,4096,2048,64,4
PROF_TAG=ffi-dswiglu kernel_profile "${PROF_S:-150}" \
  "paper-1.4B-n256,paper-7B-n256,paper-30B-n256" "ffi,ffi:dswiglu=warp" 0.05
PROF_TAG=mixed kernel_profile "${MIX_S:-200}" "paper-7B-n256,paper-120B-n1024" \
  "pallas,pallas+dx_pairs=ffi,pallas+up_proj/dw1=ffi,pallas+dh/dw2=ffi:dswiglu=warp,pallas::dw1.cluster_m=2" 0.05
echo "== [$(since) s] done"
