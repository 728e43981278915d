#!/usr/bin/env bash
# Session 29's device calls (carry the built library, ABI 14: sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=tma (any Hopper GPU): GemmConfig 14 (TMA_AB_128x256_C1, our kernels with both operands
#   by TMA for the plain bf16 varlen-M and varlen-K kinds, not yet run on a GPU): its GPU tests
#   against ragged_dot / the xla dW2 (topk, empty experts, one expert), then
#   `python -m sonic_jax.ffi.sweep --gemms-only --only-schedules TMA_AB_128x256_C1` at
#   120B-n1024 and 30B-n512 (up_proj, down_proj, dx_pairs, dw1 and dw2 under their default and
#   config 14, the layer with the default and the swept table).
# PART=prof (any Hopper GPU): kernel profile of the ffi step with the varlen-M bf16 kinds under
#   their default (no cluster), config 14 (with varlen-K bf16 too), and the old 2 x 1 cluster,
#   variants interleaved.
# PART=auto: tma, then bench on an H200 or prof at 30B-n512 elsewhere, within $CALL_S seconds.
# PART=bench|gather|sweep|tests: as scripts/device_s28.sh.
#   run(command="PART=gather,prof bash scripts/device_s29.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s29_out}
begin_call
PART=${PART:-tma}
for part in ${PART//,/ }; do
case $part in
tma)
  gpu_tests "${TEST_S:-150}" tests/test_ffi.py -k "TMA_AB"
  cp "$OUT/gpu-tests.log" "$OUT/gpu-tests-tma.log"
  ffi_sweep "${SWEEP_S:-200}" tma-sweep "^config|  (down_proj|up_proj|dx_pairs|dw1|dw2|layer)|MEASURED" \
    --gemms-only --only-schedules TMA_AB_128x256_C1 \
    --configs ${SWEEP_CONFIGS:-32768,4096,1024,128,8 32768,4096,512,128,8}
  ;;
prof)
  # The ffi step under the varlen-M bf16 default (no cluster), config 14, and the old 2 x 1
  # cluster, interleaved.
  kinds="VARLEN_M_NN_BF16 VARLEN_M_NT_BF16"
  TMA=$(for k in $kinds VARLEN_K_BF16; do printf ':schedule=%s@TMA_AB_128x256_C1' "$k"; done)
  OLD=$(for k in $kinds; do printf ':schedule=%s@COOPERATIVE_128x256_C2x1' "$k"; done)
  PROF_TAG=sched kernel_profile "${PROF_S:-300}" \
    "${PROF_CONFIGS:-paper-30B-n512,paper-120B-n1024}" "${PROF_VARIANTS:-ffi,ffi$OLD}" 0.05
  ;;
auto)
  # One call on whatever GPU comes, within ${CALL_S:-500} s: the tma part, then on an H200 the
  # layer benchmark with the seconds left, elsewhere the prof part at 30B-n512.
  TEST_S=${TEST_S:-100} SWEEP_S=${SWEEP_S:-180} OUT=$OUT PART=tma bash scripts/device_s29.sh \
    | grep -v "^== \[.*\] done"
  left=$(( ${CALL_S:-500} - $(since) ))
  if grep -q H200 "$OUT/gpu.txt"; then
    OUT=$OUT PART=bench TOTAL_S=$left bash scripts/device_s29.sh | grep -v "^== \[.*\] done"
  elif (( left > 90 )); then
    OUT=$OUT PART=prof PROF_S=$(( left - 10 )) PROF_CONFIGS=paper-30B-n512 \
      bash scripts/device_s29.sh | grep -v "^== \[.*\] done"
  fi
  ;;
bench|gather|sweep|tests)
  OUT=$OUT PART=$part BENCH_TAG=${BENCH_TAG:-s29} bash scripts/device_s28.sh | grep -v "^== \[.*\] done"
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
