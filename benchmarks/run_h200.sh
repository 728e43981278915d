#!/usr/bin/env bash
# The recorded H200 benchmark: all 12 paper configs + the 4 model presets, every sonic_jax backend
# that resolves there (pallas, ffi; xla only where its densified ragged_dot fits), the baselines
# (jax ragged_dot_mgpu grouped-GEMM MoE, tokamax, lax.ragged_dot, PyTorch SonicMoE) and the dense
# ceiling, with correctness checks against the xla backend; plus one small config (T=4096,
# d=1024, n=512, E=16, K=2) where the xla backend and lax.ragged_dot fit. Fits ~8 minutes of GPU
# wall time: passes stop starting new measurements when their share of the budget is spent
# (sonic_jax/bench/runner.py, PASS_SHARES) and the script always writes what was measured.
#
# Run from the repository root on the GPU machine (device tool), e.g.
#   run(command="bash benchmarks/run_h200.sh", carry=[".gpu_wheels"], timeout_s=600)
# where .gpu_wheels/ holds the wheels from /work/shared/tools/gpu-wheels (tokamax, sonicmoe,
# cutlass groups; any subset). Results land in benchmarks/results/ there and are copied to $OUT:
#   bench-h200-<date>.json / .md / -tflops.png / -memory.png, run_h200.log (+ ffi_build.log and
#   the built libsonic_jax_cuda.so when the FFI library was built here).
# Back here: copy those files into benchmarks/results/, commit, then regenerate the README section:
#   python -m sonic_jax.bench.readme
#
# Knobs (environment): BENCH_TOTAL_S (default 470: seconds for everything), WHEELS_DIR
# ("installed": the caller already installed them into /tmp/site),
# BUILD_FFI (auto|0|1; auto = build csrc/ when the library is missing and nvcc exists),
# FFI_BUILD_S (default 240), RESULTS_DIR (default benchmarks/results; $OUT keeps the JSON even
# when the device call is cut short), BENCH_ARGS (extra arguments for python -m sonic_jax.bench;
# later options override earlier ones), ISOLATE (default 1; 0 runs every implementation in one
# process, so the checks of several backends share each xla reference).
# A prebuilt libsonic_jax_cuda.so carried as sonic_jax/ffi/libsonic_jax_cuda.so skips the build.
set -uo pipefail
T0=$(date +%s)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/quack_cache}
OUT=${OUT:-$PWD/bench_out}
RESULTS=${RESULTS_DIR:-benchmarks/results}
mkdir -p "$OUT" "$RESULTS"
LOG="$OUT/run_h200.log"
exec > >(tee -a "$LOG") 2>&1
PY=${PYTHON:-python3}
TOTAL=${BENCH_TOTAL_S:-470}
since() { echo $(( $(date +%s) - T0 )); }
echo "== run_h200.sh $(date -u '+%F %T UTC') on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true

# 1. Carried wheels (tokamax, the PyTorch SonicMoE stack, CUTLASS headers), installed aside.
WHEELS=""
for d in "${WHEELS_DIR:-}" .gpu_wheels .whl; do
  if [ -n "$d" ] && compgen -G "$d/*.whl" >/dev/null; then WHEELS=$d; break; fi
done
if [ "${WHEELS_DIR:-}" = installed ]; then
  echo "== wheels already installed in /tmp/site by the caller"
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:${PYTHONPATH:-}
elif [ -n "$WHEELS" ]; then
  echo "== installing wheels from $WHEELS: $(cd "$WHEELS" && ls *.whl | tr '\n' ' ')"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      "$WHEELS"/*.whl || echo "warning: wheel install failed; those baselines will be skipped"
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:${PYTHONPATH:-}
else
  echo "== no carried wheels: tokamax / PyTorch SonicMoE baselines will be reported unavailable"
fi
if ! $PY -c "import xprof" 2>/dev/null; then
  # tokamax imports xprof at start-up; its ragged_dot needs only this name.
  mkdir -p /tmp/xprof_stub/xprof/cli
  touch /tmp/xprof_stub/xprof/__init__.py /tmp/xprof_stub/xprof/cli/__init__.py
  echo "get_kernel_stats_tool = None" > /tmp/xprof_stub/xprof/cli/tools.py
  export PYTHONPATH=${PYTHONPATH:-}:/tmp/xprof_stub
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}

# 2. The FFI library (optional backend): build it here when it is missing.
BUILD_FFI=${BUILD_FFI:-auto}
if [ -f csrc/CMakeLists.txt ] && [ "$BUILD_FFI" != 0 ]; then
  if $PY -c "import sys; from sonic_jax.ffi._lib import find_library; sys.exit(find_library() is not None)" 2>/dev/null \
     && { [ "$BUILD_FFI" = 1 ] || command -v nvcc >/dev/null; }; then
    CUTLASS_INC=${CUTLASS_INCLUDE_DIR:-/tmp/site/cutlass_library/source/include}
    echo "== building the FFI library (limit ${FFI_BUILD_S:-240} s, CUTLASS at $CUTLASS_INC)"
    if timeout "${FFI_BUILD_S:-240}" $PY -m sonic_jax.ffi.build --cutlass-include "$CUTLASS_INC" \
         --jobs "$(nproc)" > "$OUT/ffi_build.log" 2>&1; then
      echo "   built in $(since) s"
      f=sonic_jax/ffi/libsonic_jax_cuda.so
      [ -f $f ] && [ "$(stat -c %s $f)" -lt 16000000 ] && cp $f "$OUT/"
    else
      echo "   FFI build failed or timed out; the ffi backend will be reported unavailable:"
      tail -n 5 "$OUT/ffi_build.log"
    fi
  fi
fi

# 3. The benchmark, every implementation in its own process (--isolate: a kernel that breaks the
#    CUDA context costs only its own rows). The JSON is saved after every implementation; a hard
#    timeout leaves time to write the Markdown and plots from whatever was measured.
LEFT=$(( TOTAL - $(since) - 25 ))
[ $LEFT -lt 90 ] && LEFT=90
echo "== python -m sonic_jax.bench (budget $LEFT s, $(since) s spent so far)"
$PY - <<'PY' || true
import sonic_jax, jax
print("jax", jax.__version__, jax.devices(), "available backends:", sonic_jax.available_backends())
for name in ("pallas", "ffi"):
  try:
    sonic_jax.resolve_backend(name)
  except Exception as e:
    print(f"  {name}: {e}")
PY
timeout --signal=TERM --kill-after=10 $(( LEFT + 60 )) \
  $PY -m sonic_jax.bench --configs all 4096,1024,512,16,2 --backends auto --baselines all \
    $([ "${ISOLATE:-1}" = 0 ] || echo --isolate) \
    --warmup 2 --iters 10 --time-budget-s "$LEFT" --out-dir "$RESULTS" ${BENCH_ARGS:-}
rc=$?
JSON=$(ls -t "$RESULTS"/bench-*.json 2>/dev/null | head -n 1)
if [ $rc -ne 0 ] && [ -n "$JSON" ]; then
  echo "== the benchmark stopped (exit $rc): writing the report from $JSON"
  $PY -m sonic_jax.bench.report "$JSON" || true
fi
if [ -n "$JSON" ]; then
  STEM=${JSON%.json}
  cp "$STEM".json "$STEM".md "$OUT"/ 2>/dev/null
  cp "$STEM"-*.png "$OUT"/ 2>/dev/null
fi
echo "== done in $(since) s; files in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
