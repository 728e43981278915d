#!/usr/bin/env bash
# Session 32's device calls (carry the built library, ABI 14: sonic_jax/ffi/libsonic_jax_cuda.so).
# Session 32 had no device time left; these are for the next session.
# PART=pingpong (any Hopper GPU): the ping-pong gather kernels (GemmConfig 15, 16, 17: a 64 x 256
#   tile per consumer warpgroup, each one's epilogue under the other's mainloop; not yet run on
#   a GPU): their GPU tests (gathered GEMMs and both fused epilogues against fp64 references,
#   determinism, the in-order SwiGLU kernel, the layer against xla), then the kernel profile of
#   the step with them against the defaults at 7B-n256 (session 31, H100: the defaults
#   3.912 ms at 7B-n256 and 20.267 at 30B-n512, fused_epilogue="dh" under config 13 4.584 /
#   22.126).
#   run(command="PART=pingpong bash scripts/device_s32.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
#   The profile takes about 35 s per (config, variant) after its compile (session 31), so one
#   config per call: PROF_CONFIGS=paper-30B-n512 PART=ppprof for the second.
# PART=pptests / ppprof: the tests / the profile alone (PROF_CONFIGS, PROF_S to change it).
# PART=pallaspp (any Hopper GPU): the Pallas ring kernels ping-pong (GemmConfig(wg_split=
#   "pingpong"), DhConfig(pipelines=2, pipeline_ring="shared")): their GPU tests (session 33:
#   the 150 s limit of then stopped them after 12 passes, now 300 s), then the kernel profile
#   of the step with them against the heuristic.
#   run(command="PART=pallaspp bash scripts/device_s32.sh"); PART=pallasprof: the profile alone.
# PART=next: pingpong (the layer benchmark on an H200, PART=bench, takes a call of its own).
# PART=dhregs|ncuswiglu|swiglu|bench|...: as scripts/device_s31.sh.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s32_out}
begin_call
# The defaults; dh's dSwiGLU epilogue ping-pong (with and without the cluster); up_proj's SwiGLU
# epilogue ping-pong over the gathered copy (config 17), alone and with the ping-pong dh; both
# fused epilogues ping-pong (dW1 then re-gathers x); dh's plain in-GEMM gather ping-pong.
PP_VARIANTS="ffi,ffi:fused_epilogue=dh:gather_schedule=pingpong_c1,\
ffi:fused_epilogue=dh:gather_schedule=pingpong,ffi:up_proj_epilogue=gemm_pingpong,\
ffi:up_proj_epilogue=gemm_pingpong:fused_epilogue=dh:gather_schedule=pingpong_c1,\
ffi:fused_epilogue=both:gather_schedule=pingpong_c1,ffi:fused-gather=dh:gather_schedule=pingpong_c1"
# Pallas: the heuristic; the forward GEMMs ping-pong on the shared ring (all three, up_proj
# alone, down_proj and dx_pairs), up_proj on the split rings, up_proj and down_proj on
# 128-row tiles per consumer (CUTLASS's ping-pong shape: 128 x 2·64 and 128 x 128); dh
# ping-pong (64 x 256 per consumer, 4 stages) on the shared ring and on the split rings
# (session 14's form). All lower for CUDA on the CPU at 7B-n256 and 30B-n512.
DH_PP="dh.pipelines=2:dh.block_m=64:dh.num_consumers=1:dh.max_concurrent_steps=4"
PP128="up_proj.block_m=128:up_proj.block_n=64:down_proj.block_m=128:down_proj.block_n=128"
PALLAS_PP_VARIANTS="pallas,pallas::pingpong,pallas::pingpong=up_proj,\
pallas::pingpong=down_proj/dx_pairs,pallas::pingpong=up_proj:up_proj.pingpong_ring=split,\
pallas::pingpong=up_proj/down_proj:${PP128},\
pallas::${DH_PP}:dh.pipeline_ring=shared,pallas::${DH_PP}:dh.pipeline_ring=split"
for part in ${PART//,/ }; do
[[ $part == next ]] && part=pingpong
for part in $part; do
case $part in
pallaspp|pallasprof)
  if [[ $part == pallaspp ]]; then
    gpu_tests "${TEST_S:-300}" tests/test_pallas_forward.py tests/test_pallas_backward.py \
      -k "pingpong or 2pipes or test_gpu_forward_matches_xla"
  fi
  PROF_TAG=pallaspp kernel_profile "${PROF_S:-330}" \
    "${PROF_CONFIGS:-paper-7B-n256}" "${PALLAS_PP_VARIANTS}" 0.05
  ;;
pingpong|pptests|ppprof)
  if [[ $part != ppprof ]]; then
    gpu_tests "${TEST_S:-180}" tests/test_ffi.py -k "PINGPONG or pingpong"
  fi
  if [[ $part != pptests ]]; then
    PROF_TAG=pingpong kernel_profile "${PROF_S:-330}" \
      "${PROF_CONFIGS:-paper-7B-n256}" "${PP_VARIANTS}" 0.05
  fi
  ;;
*)
  OUT=$OUT PART=$part bash scripts/device_s31.sh | grep -v "^== \[.*\] done"
  ;;
esac
done
done
echo "== [$(since) s] done"
