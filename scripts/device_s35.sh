#!/usr/bin/env bash
# Session 35's device calls (carry the built library, ABI 15 since 2465539:
# sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=auto: on an H200 the layer benchmark (PART=bench of scripts/device_s32.sh, the configs
#   that miss a target, $BENCH_CONFIGS), elsewhere sweep256.
# PART=sweep256 (any Hopper GPU): every instantiated schedule of each grouped GEMM at the three
#   n = 256 paper configs (session 28's schedules, the 128 x 256 tile without a cluster and
#   ping-pong 64 x 256 among them, were swept at n = 512 and 1024 only; session 18's n = 256
#   sweep predates them). Rows gathered beforehand, each schedule checked against the first.
# PART=xpath (any Hopper GPU): session 34's x-path default (`ffi`) against the old one in the
#   same interleaved kernel profile at the n = 256 configs.
# PART=ppc1 (any Hopper GPU; rebuild the library first, ABI 15): GemmConfig 18 / 19 (CUTLASS's
#   ping-pong without a cluster, bf16 varlen-M kinds) against xla (every routing case), then
#   those two schedules against each kind's default (--only-schedules) at 120B-n512 (down_proj
#   514 TFLOP/s against up_proj's 678 in session 34's H100 step: its reduction is K = n = 512,
#   a short mainloop next to an exposed epilogue) and the n = 256 configs, where down_proj is
#   0.66-0.68x dense; 100 s each ($SWEEP_S, $SWEEP_CONFIGS).
# PART=mix (any Hopper GPU): the pallas forward with the ffi backward (MixedKernels), and ffi with
#   pallas' up_proj (SwiGLU in its epilogue, x read in the kernel), against both backends in one
#   interleaved profile: session 35's H200 layer rows have pallas' forward faster and ffi's
#   backward faster at 7B-n256 (391 / 385 against 361 / 403 TFLOP/s), 1.4B-n256 and 120B-n512.
# PART=dout512 (any Hopper GPU): dh and dW2 reading dO through gather_idx at n = 512, d >= 1536
#   (dout_in_gemm says no there since session 22) against the default, interleaved profile. From
#   session 34's H100 per-kernel medians (both paths in the GEMM vs both scattered), the dO path
#   alone would be 1.1-1.6 % faster at 7B-n512, 30B-n512 and 120B-n512, and the step would lose
#   its (T·K, d) copy of dO (4 GiB at 120B-n512).
# PART=power (any Hopper GPU): benchmarks/power_trace.py (power, clocks and throttle reasons under
#   a sustained step; its kernels cold and hot) at $POWER_RUNS (config/variant pairs): session
#   35's long configs ran 1-9 % slower than earlier sessions' for both backends, and ffi's
#   down_proj at paper-30B-n256 took 3.03 ms in the step against 2.44 ms alone.
# PART=bench|upfused|xtests|...: as scripts/device_s33.sh.
#   run(command="PART=auto bash scripts/device_s35.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s35_out}
begin_call
# dout_only_profile TAG SECONDS CONFIGS: the interleaved kernel profile of the defaults (`ffi`)
# against dh and dW2 alone reading dO through gather_idx (the x path scattered) at
# ${PROF_CONFIGS:-CONFIGS}; log in $OUT/profile-TAG.log.
dout_only_profile() {
  PROF_TAG=$1 kernel_profile "$2" "${PROF_CONFIGS:-$3}" \
    "ffi,ffi:fused-gather=dh:wgrad-gather=dw2" 0.05
  grep -E "ms  |--|^ +[0-9]+ +[0-9.]+ " "$OUT/profile-$1.log" | cut -c1-150 | head -n 90
}
for part in ${PART//,/ }; do
if [[ $part == auto ]]; then
  grep -q H200 "$OUT/gpu.txt" && part=bench || part=sweep256
fi
case $part in
sweep256)
  for cfg in ${SWEEP_CONFIGS:-24576,1536,256,128,8 40960,768,256,128,8 32768,4096,256,256,16}; do
    ffi_sweep "${SWEEP_S:-150}" "sweep-${cfg//,/_}" "^config| ms |MEASURED" \
      --gemms-only --configs "$cfg"
  done
  ;;
xpath)
  dout_only_profile xpath "${PROF_S:-420}" paper-7B-n256,paper-1.4B-n256,paper-30B-n256
  ;;
ppc1)
  gpu_tests "${TEST_S:-120}" tests/test_ffi.py -k "every_gemm_schedule and PINGPONG and C1x1"
  for cfg in ${SWEEP_CONFIGS:-32768,4096,512,256,16 24576,1536,256,128,8 32768,4096,256,256,16 40960,768,256,128,8}; do
    ffi_sweep "${SWEEP_S:-100}" "ppc1-${cfg//,/_}" "^config| ms |MEASURED" \
      --gemms-only --only-schedules PINGPONG_128x128_C1x1 PINGPONG_64x256_C1x1 --configs "$cfg"
  done
  ;;
mix)
  PROF_TAG=mix kernel_profile "${PROF_S:-540}" \
    "${PROF_CONFIGS:-paper-7B-n256,paper-1.4B-n256,paper-120B-n512}" \
    "${MIX_VARIANTS:-pallas,ffi,pallas+dh/dw2/dx_pairs/dw1=ffi,ffi+up_proj=pallas}" 0.05
  grep -E "ms  |--|^ +[0-9]+ +[0-9.]+ " "$OUT/profile-mix.log" | cut -c1-150 | head -n 160
  ;;
dout512)
  dout_only_profile dout512 "${PROF_S:-400}" paper-7B-n512,paper-30B-n512,paper-120B-n512
  ;;
power)
  for run in ${POWER_RUNS:-paper-30B-n256/ffi paper-30B-n256/pallas paper-7B-n256/ffi}; do
    cfg=${run%%/*} variant=${run#*/}
    echo "== [$(since) s] power trace $cfg $variant"
    timeout "${POWER_S:-110}" $PY benchmarks/power_trace.py --config "$cfg" --variant "$variant" \
      --seconds "${POWER_LOAD_S:-15}" --out-dir "$OUT/power-$cfg-$variant" \
      > "$OUT/power-$cfg-$variant.log" 2>&1
    grep -vE "^\s*$|Warning|warn\(" "$OUT/power-$cfg-$variant.log" | cut -c1-150 | tail -n 40
  done
  ;;
*)
  OUT=$OUT PART=$part bash scripts/device_s33.sh | grep -v "^== \[.*\] done"
  ;;
esac
done
echo "== [$(since) s] done"
