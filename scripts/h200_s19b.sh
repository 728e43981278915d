#!/usr/bin/env bash
# Session 19, call 2 (after scripts/h200_s19.sh; carry the built library):
# 1. per-kernel profile of the pallas step against mixes that take some entry points from ffi
#    (sonic_jax.mixed.MixedKernels), and pallas with dW1 on 2-CTA clusters (the one kernel
#    session 18 saw gain from it);
# 2. compute-sanitizer memcheck of the gathered varlen-K kernel and of every varlen-M schedule
#    (the cooperative ones never ran under the sanitizer).
#   run(command="bash scripts/h200_s19b.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s19b_out}
begin_call
PROF_TAG=mixed kernel_profile "${MIX_S:-150}" "paper-7B-n256,paper-120B-n1024" \
  "pallas,pallas+dx_pairs=ffi,pallas+up_proj/dw1=ffi,pallas+dw1/dw2=ffi:wgrad-gather,pallas+dh/dw2=ffi:dswiglu=warp,pallas::dw1.cluster_m=2" 0.05
memcheck "${MC_S:-200}" tests/test_ffi.py \
  -k "(gathered_varlen_k and (topk or ragged or empty)) or (every_gemm_schedule and COOPERATIVE)"
echo "== [$(since) s] done"
