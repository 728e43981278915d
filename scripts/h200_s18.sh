#!/usr/bin/env bash
# Session 18, one device call (build the ffi library on the CPU machine first):
# 1. GPU tests of the pallas 2-CTA cluster kernels (forward GemmConfig(cluster_m=2), dh and
#    dW rings with cluster_m=2), never run on a GPU before;
# 2. per-kernel profile of the pallas layer step, heuristic configs against cluster_m=2 on
#    every ring kernel, at three paper configs;
# 3. per-kernel profile of the ffi layer step: the default backend against the in-GEMM gather
#    under the tma_b schedule (which beat gather_rows + GEMM in session 18's first call: up_proj
#    6.93 vs 7.04 ms, dh 3.53 vs 4.09 at 120B-n1024, while the layer was 1.1 ms slower) and the
#    fused epilogues under tma_b.
#   run(command="bash scripts/h200_s18.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s18_out}
begin_call
gpu_tests "${TEST_S:-180}" tests/test_pallas_forward.py tests/test_pallas_backward.py \
  -k "${TEST_K:-gpu_cluster or cluster2}"
PROF_TAG=pallas PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-230}" \
  "${PROF_CONFIGS:-paper-7B-n256,paper-30B-n512,paper-120B-n1024}" \
  "pallas,pallas::up_proj.cluster_m=2:down_proj.cluster_m=2:dx_pairs.cluster_m=2:dh.cluster_m=2:dw1.cluster_m=2:dw2.cluster_m=2" 0.05
PROF_TAG=ffi PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S2:-150}" \
  "${PROF_CONFIGS2:-paper-120B-n1024,paper-7B-n256}" \
  "ffi,ffi:fused-gather:gather_schedule=tma_b,ffi:fused_epilogue=both:gather_schedule=tma_b" 0.05
echo "== [$(since) s] done"
