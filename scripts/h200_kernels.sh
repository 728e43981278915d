#!/usr/bin/env bash
# One device call for kernel work (fused gathers, Triton selection), logs packed into $OUT/logs.tgz
# (the steps run in this order):
#   1. the Pallas forward GPU tests (xla and fused gather, against the xla backend);
#   2. (opt-in, PB_TEST_S > 0) the backward's fused-gather and cross-tile GPU tests: one process
#      and PB_TEST_S seconds per ';'-separated PB_TEST_K expression;
#   3. benchmarks/pallas_forward.py (PF_PARTS: up_proj, the whole forward, ..., "train" = the
#      layer's forward+backward with XLA-gather vs fused-gather backward kernels);
#   4. (opt-in, PB_BENCH_S > 0) benchmarks/pallas_backward.py (PB_ARGS, e.g. "--only wgrad");
#   5. the Triton GPU tests (routing kernels and the radix-select kernel);
#   6. benchmarks/token_rounding_select.py with a config sweep.
#   run(command="bash scripts/h200_kernels.sh", carry=[".whl"], timeout_s=600)
# Knobs: PF_TEST_S, PF_TEST_K, PF_BENCH_S, PF_CONFIGS, PF_PARTS, PF_ARGS, PB_TEST_S, PB_TEST_K,
# PB_BENCH_S, PB_ARGS, TRITON_TEST_S, SELECT_S, SELECT_CONFIGS.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/kernels_out}
LOGS=/tmp/kernel_logs
mkdir -p "$OUT" "$LOGS"
pack() { tar czf "$OUT/logs.tgz" -C /tmp kernel_logs; }
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$LOGS/gpu.txt"
if [ "${PF_TEST_S:-150}" -gt 0 ]; then
  echo "== [$(since) s] Pallas forward GPU tests"
  timeout "${PF_TEST_S:-150}" $PY -m pytest -m gpu -q -p no:cacheprovider -x \
    tests/test_pallas_forward.py -k "${PF_TEST_K:-gpu_forward}" 2>&1 \
    | tee "$LOGS/pallas-forward-gpu-tests.log" | tail -n 15
  pack
fi
if [ "${PB_TEST_S:-0}" -gt 0 ]; then
  # One pytest process per ';'-separated -k expression, each under its own timeout, so a kernel
  # that hangs or faults (it poisons the CUDA context) costs only its own step.
  IFS=';' read -ra PB_KS <<< "${PB_TEST_K:-wgrad_fused;dh_fused;cross_tile}"
  for kexpr in "${PB_KS[@]}"; do
    echo "== [$(since) s] Pallas backward GPU tests -k '$kexpr'"
    timeout "${PB_TEST_S}" $PY -m pytest -m gpu -q -p no:cacheprovider \
      tests/test_pallas_backward.py tests/test_pallas_forward.py -k "$kexpr" 2>&1 \
      | tee -a "$LOGS/pallas-backward-gpu-tests.log" | tail -n 8
    pack
  done
fi
if [ "${PF_BENCH_S:-200}" -gt 0 ]; then
  echo "== [$(since) s] pallas_forward.py (${PF_PARTS:-up,forward})"
  mkdir -p "$LOGS/pf"
  timeout "${PF_BENCH_S:-200}" $PY benchmarks/pallas_forward.py --out-dir "$LOGS/pf" \
    --configs "${PF_CONFIGS:-7B-1024,30B-512,7B-256,120B-1024}" --parts "${PF_PARTS:-up,forward}" ${PF_ARGS:-} \
    2>&1 | tail -n 40
  pack
fi
if [ "${PB_BENCH_S:-0}" -gt 0 ]; then
  echo "== [$(since) s] pallas_backward.py ${PB_ARGS:-}"
  mkdir -p "$LOGS/pb"
  timeout "${PB_BENCH_S}" $PY benchmarks/pallas_backward.py --out "$LOGS/pb" ${PB_ARGS:-} 2>&1 \
    | tail -n 30
  pack
fi
if [ "${TRITON_TEST_S:-120}" -gt 0 ]; then
  echo "== [$(since) s] Triton GPU tests"
  timeout "${TRITON_TEST_S:-120}" $PY -m pytest -m gpu -q -p no:cacheprovider \
    tests/test_triton.py tests/test_triton_select.py 2>&1 \
    | tee "$LOGS/triton-gpu-tests.log" | tail -n 12
  pack
fi
if [ "${SELECT_S:-80}" -gt 0 ]; then
  echo "== [$(since) s] token-rounding selection"
  timeout "${SELECT_S:-80}" $PY benchmarks/token_rounding_select.py \
    --configs "${SELECT_CONFIGS:-default,2048:8:8,1024:8:4,4096:8:8,2048:4:8}" \
    --out "$LOGS/token-rounding-select-h200.md" 2>&1 | tail -n 24
  pack
fi
echo "== [$(since) s] done"
