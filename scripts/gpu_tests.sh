#!/usr/bin/env bash
# Every GPU-marked test in one device call (H200): builds the FFI library when it is missing and
# nvcc is there, then runs `pytest -m gpu` over the whole suite with a JUnit report under $OUT.
#   run(command="bash scripts/gpu_tests.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# A prebuilt library carried at sonic_jax/ffi/libsonic_jax_cuda.so skips the build.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
if ! $PY -c "import sys; from sonic_jax.ffi._lib import find_library; sys.exit(find_library() is None)" \
   && command -v nvcc >/dev/null && [ -n "${CUTLASS_INCLUDE_DIR:-}" ]; then
  echo "== building the FFI library"
  $PY -m sonic_jax.ffi.build --cutlass-include "$CUTLASS_INCLUDE_DIR" --jobs "$(nproc)" \
    > "$OUT/ffi_build.log" 2>&1 || tail -n 20 "$OUT/ffi_build.log"
fi
$PY -c "import sonic_jax; print('available backends:', sonic_jax.available_backends())"
$PY -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" tests 2>&1 \
  | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
