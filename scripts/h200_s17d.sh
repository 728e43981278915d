#!/usr/bin/env bash
# Prepared in session 17 (no device was lent that session): the pallas backend's 2-CTA cluster
# option of the ring GEMMs, GemmConfig(cluster_m=2) (up_proj with the fused gather, down_proj,
# dx_pairs), DhConfig(cluster_m=2) (dh's ring kernel) and WgradConfig(cluster_m=2) (dW1 / dW2's
# ring kernel): the two CTAs of a cluster take neighbouring M tiles of one expert and load the
# shared weight tile by TMA multicast, so each reads half the weight bytes from L2 (what
# cuBLAS's dense GEMM does; these GEMMs are at 0.67-0.86x dense, issue #3). Interpret-mode and
# lowering tests pass on the CPU; it has never run on a GPU.
# 1. GPU tests: the cluster kernels against xla (forward at three shapes, dh against the
#    default kernel), and the ring / forward GPU tests (make_tiles changed for every kernel);
# 2. per-kernel profile of the layer step, the heuristic configs against the same with
#    cluster_m=2 on up_proj, down_proj, dx_pairs and dh, at three paper configs.
# If faster, set cluster_m=2 in configs.swiglu_gemm_config / plain_gemm_config's ring rows.
#   run(command="bash scripts/h200_s17d.sh")
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s17d_out}
begin_call
gpu_tests "${TEST_S:-200}" tests/test_pallas_forward.py -k "${TEST_K:-cluster or cross_tile or gpu_forward}"
mv "$OUT/gpu-tests.log" "$OUT/gpu-tests-forward.log"
gpu_tests "${TEST_S2:-150}" tests/test_pallas_backward.py -k "${TEST_K2:-dh_fused_gather_matches_default or wgrad_fused_gather_matches_default}"
PROF_ROUNDS=3 PROF_ITERS=5 kernel_profile "${PROF_S:-240}" \
  "${PROF_CONFIGS:-paper-7B-n256,paper-30B-n512,paper-120B-n1024}" \
  "pallas,pallas::up_proj.cluster_m=2:down_proj.cluster_m=2:dx_pairs.cluster_m=2:dh.cluster_m=2:dw1.cluster_m=2:dw2.cluster_m=2" 0.05
echo "== [$(since) s] done"
