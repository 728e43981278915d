#!/usr/bin/env bash
# One device call for the ffi backend's opt-in fused gather (FfiKernels(fused_gather=True)), never
# run on a GPU yet: its GPU tests, the unfused kinds after the ABI-3 rebuild, a memcheck of one
# case, then the fused-vs-unfused sweep. Logs packed into $OUT/ffi_logs.tgz after every step.
#   run(command="bash scripts/h200_ffi_fused.sh",
#       carry=["sonic_jax/ffi/libsonic_jax_cuda.so"], timeout_s=600)
# The library is built on the CPU box (python -m sonic_jax.ffi.build, docs/ffi.md). Knobs:
# FT_S (fused tests, 150), ALL_S (all ffi GPU tests, 150), MC_S (memcheck, 120), SW_S (sweep, 150).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/ffi_out}
LOGS=/tmp/ffi_logs
mkdir -p "$OUT" "$LOGS"
pack() { tar czf "$OUT/ffi_logs.tgz" -C /tmp ffi_logs; }
step() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo "== $name"
  timeout "$secs" "$@" 2>&1 | tee "$LOGS/$name.log" | tail -n 12
  pack
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
step fused-tests "${FT_S:-150}" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_ffi.py \
  -k "gathered or fused_gather" -x
step all-ffi-tests "${ALL_S:-150}" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_ffi.py -x
step memcheck "${MC_S:-120}" compute-sanitizer --tool memcheck $PY -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_ffi.py -k "gathered_gemm_matches and topk" -x
step sweep "${SW_S:-150}" $PY -m sonic_jax.ffi.sweep --fused-gather-only \
  --configs 32768,4096,1024,128,8 --iters 5
echo "== done"
