# Sourced by the scripts/h200_*.sh device-call scripts (run from the repository root): the start
# and the steps they share. Sets T0 and PY, the environment (unbuffered Python, no GPU memory preallocation,
# this checkout on PYTHONPATH), since (seconds since T0), and install_wheels DIR [PATH...]: the
# carried wheels in DIR, if any, installed aside into /tmp/site, which joins PYTHONPATH with the
# extra PATHs.
T0=$(date +%s)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
since() { echo $(( $(date +%s) - T0 )); }
install_wheels() {
  local dir=$1 extra
  shift
  compgen -G "$dir/*.whl" >/dev/null || return 0
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      "$dir"/*.whl || echo "warning: wheel install failed"
  export PYTHONPATH=$PYTHONPATH:/tmp/site
  for extra in "$@"; do PYTHONPATH=$PYTHONPATH:$extra; done
}

# The steps the device calls share; each writes its full log under $OUT and prints a summary.

# begin_call [SUBDIR...]: $OUT and its SUBDIRs created, the carried wheels in .whl installed,
# the GPU's name, driver, top SM clock and power limits recorded in $OUT/gpu.txt.
begin_call() {
  local sub
  mkdir -p "$OUT"
  for sub in "$@"; do mkdir -p "$OUT/$sub"; done
  install_wheels .whl
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,enforced.power.limit \
    --format=csv,noheader | tee "$OUT/gpu.txt"
}

# gpu_tests SECONDS FILE -k EXPR: the marked GPU tests of FILE selected by EXPR, log in
# $OUT/gpu-tests.log, or with TESTS_TAG set in gpu-tests-$TESTS_TAG.log (several runs in one
# call).
gpu_tests() {
  local secs=$1 file=$2 log=$OUT/gpu-tests${TESTS_TAG:+-$TESTS_TAG}.log
  shift 2
  echo "== [$(since) s] GPU tests${TESTS_TAG:+ $TESTS_TAG}"
  timeout "$secs" $PY -m pytest -q -rA -m gpu "$file" "$@" > "$log" 2>&1
  grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$log" | head -n 20 | cut -c1-200
}

# auto_bench TEST_S TOTAL_S TAG CONFIG...: the GPU test of auto's choices (forward and
# gradients against xla), then the layer benchmark of $BACKENDS (default pallas, ffi and
# pallas+ffi) on the CONFIGs until TOTAL_S (layer_bench).
auto_bench() {
  local test_s=$1 total=$2 tag=$3
  shift 3
  gpu_tests "$test_s" tests/test_backends.py -k "gpu_auto"
  tail -n 3 "$OUT/gpu-tests.log" | cut -c1-200
  BACKENDS=${BACKENDS:-pallas,ffi,pallas+ffi} layer_bench "$total" "$tag" "$@"
}

# memcheck SECONDS FILE -k EXPR: compute-sanitizer memcheck of the marked GPU tests of FILE
# selected by EXPR, log in $OUT/memcheck.log. XLA's platform allocator (every buffer its own
# allocation) and no autotuning: with XLA's defaults the process segfaulted under the sanitizer
# (session 20). Even so, on the H100 image of session 31 it segfaulted in tests that also run
# the xla backend (layer and entry-point tests against xla); select kernel tests.
memcheck() {
  local secs=$1 file=$2
  shift 2
  echo "== [$(since) s] memcheck"
  sanitized_pytest "$secs" "$OUT/memcheck.log" -q "$file" "$@"
  grep -E "ERROR SUMMARY|passed|failed|Invalid" "$OUT/memcheck.log" | head -n 20
}

# sanitized_pytest SECONDS LOG PYTEST_ARGS...: the marked GPU tests under compute-sanitizer
# memcheck, with the XLA settings memcheck above explains; output in LOG, pytest's status
# (or timeout's, or the crash's) returned.
sanitized_pytest() {
  local secs=$1 log=$2
  shift 2
  XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_FLAGS=--xla_gpu_autotune_level=0 \
    timeout "$secs" compute-sanitizer --tool memcheck $PY -m pytest -m gpu \
    -p no:cacheprovider "$@" > "$log" 2>&1
}

# memcheck_each SECONDS FILE EXPR: memcheck as above, but a crash of the sanitized process
# (XLA under compute-sanitizer segfaults now and then, session 31 / 37) does not end the check:
# the test running when it died is named in $OUT/memcheck.log and deselected, the tests that
# finished are deselected, and pytest starts again on the rest until SECONDS are spent.
memcheck_each() {
  local secs=$1 file=$2 expr=$3 end round=0 rc left id
  local -a skip=() seen=()
  end=$(( $(date +%s) + secs ))
  echo "== [$(since) s] memcheck, resumed past crashes"
  : > "$OUT/memcheck.log"
  while :; do
    left=$(( end - $(date +%s) ))
    (( left > 30 )) || { echo "memcheck: out of time" | tee -a "$OUT/memcheck.log"; break; }
    round=$((round + 1))
    sanitized_pytest "$left" "$OUT/memcheck-$round.log" -v "$file" -k "$expr" "${skip[@]}"
    rc=$?
    cat "$OUT/memcheck-$round.log" >> "$OUT/memcheck.log"
    mapfile -t seen < <(grep -oE "^$file::[^ ]+" "$OUT/memcheck-$round.log")
    for id in "${seen[@]}"; do skip+=(--deselect "$id"); done
    (( rc == 0 || rc == 1 || rc == 5 )) && break  # pytest ran to its end
    (( ${#seen[@]} > 0 )) || break
    echo "memcheck round $round: rc $rc after ${#seen[@]} tests; running: ${seen[-1]}" \
      | tee -a "$OUT/memcheck.log"
  done
  grep -hE "ERROR SUMMARY|Invalid|FAILED|passed|failed" "$OUT/memcheck.log" | head -n 30
  echo "memcheck: $(grep -cE " PASSED" "$OUT/memcheck.log") tests passed under the sanitizer"
}

# memory_report SECONDS ROWS CONFIGS VARIANTS: benchmarks/memory_report.py (compile only) into
# $OUT/mem.
memory_report() {
  echo "== [$(since) s] memory report"
  mkdir -p "$OUT/mem"
  timeout "$1" $PY benchmarks/memory_report.py --out-dir "$OUT/mem" --rows "$2" --configs "$3" \
    --variants "$4" > "$OUT/mem/report.log" 2>&1
  grep -E "^== |^ +[0-9.]+[MG]iB\( *[0-9]+%\)" "$OUT/mem/report.log" | grep -v "^== .*Error" \
    | head -n 150 | cut -c1-170
  grep -A40 "^config | variant" "$OUT/mem/report.log"
  grep -E "Error" "$OUT/mem/report.log" | head -5
  rm -rf "$OUT/mem/xla_dump"  # XLA's dump of every compile: too many files to bring back
}

# train_mixes SECONDS CONFIGS VARIANTS: pallas_forward.py --train-mixes (the layer step with
# the named variants, one process) into $OUT/mixes.
train_mixes() {
  echo "== [$(since) s] --train-mixes ($3)"
  mkdir -p "$OUT/mixes"
  timeout "$1" $PY benchmarks/pallas_forward.py --out-dir "$OUT/mixes" --configs "$2" \
    --parts train --train-mixes --train-only "$3" --skip-check --skip-baselines --iters 5 \
    > "$OUT/mixes/run.log" 2>&1
  grep -E "^==|train\[" "$OUT/mixes/run.log" | tail -n 40 | cut -c1-220
}

# kernel_profile SECONDS CONFIGS VARIANTS MIN_MS: benchmarks/kernel_profile.py (per-kernel times
# of the layer step; the variants take turns, $PROF_ROUNDS rounds of $PROF_ITERS calls), log in
# $OUT/profile.log and records in $OUT/kernel_profile.json, or with PROF_TAG set in
# profile-$PROF_TAG.log and kernel_profile-$PROF_TAG.json (several profiles in one call).
kernel_profile() {
  local log=$OUT/profile${PROF_TAG:+-$PROF_TAG}.log
  echo "== [$(since) s] kernel profile${PROF_TAG:+ $PROF_TAG}"
  timeout "$1" $PY benchmarks/kernel_profile.py --out-dir "$OUT" --iters "${PROF_ITERS:-5}" \
    --rounds "${PROF_ROUNDS:-3}" --configs "$2" --variants "$3" --min-ms "$4" \
    > "$log" 2>&1
  [[ -n "${PROF_TAG:-}" && -f "$OUT/kernel_profile.json" ]] && \
    mv "$OUT/kernel_profile.json" "$OUT/kernel_profile-$PROF_TAG.json"
  grep -E "^==|^  (pallas|xla|ffi)|^  [0-9]+ calls|^  --|body_|dispatch|gather_fusion|Error" "$log" \
    | cut -c1-150
}

# layer_bench TOTAL_S TAG CONFIG...: the layer benchmark of $BACKENDS (default pallas) and
# $BASELINES (default none) on the CONFIGs, no checks, 1 warm-up and median of 5, with the seconds
# left until TOTAL_S; results in $OUT.
layer_bench() {
  local total=$1 tag=$2
  shift 2
  local left=$(( total - $(since) ))
  echo "== [$(since) s] layer benchmark, ${left} s"
  WHEELS_DIR=installed ISOLATE=0 BUILD_FFI=0 RESULTS_DIR=$OUT BENCH_TOTAL_S=$left \
    BENCH_ARGS="--configs $* --backends ${BACKENDS:-pallas} --baselines ${BASELINES:-none} --warmup 1 --iters 5 --no-check --no-plots --tag $tag" \
    bash benchmarks/run_h200.sh 2>&1 | tail -n 22
}

# ffi_sweep SECONDS NAME GREP ARGS...: python -m sonic_jax.ffi.sweep ARGS, JSON in $OUT/NAME.json,
# log in $OUT/NAME.log; prints the log lines matching GREP (and errors).
ffi_sweep() {
  local secs=$1 name=$2 pattern=$3
  shift 3
  echo "== [$(since) s] ffi sweep $name"
  timeout "$secs" $PY -m sonic_jax.ffi.sweep --iters 10 --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  grep -E "$pattern|!!|rror" "$OUT/$name.log" | cut -c1-150
}

# wgrad_times SECONDS VARIANTS CONFIG...: benchmarks/wgrad_kernels.py --time (CUPTI medians of
# dW1 / dW2 per variant, checked against each other) at each T,d,n,E,K CONFIG, log in
# $OUT/times-<config>.txt.
wgrad_times() {
  local secs=$1 variants=$2 cfg log
  shift 2
  for cfg in "$@"; do
    log=$OUT/times-${cfg//,/_}.txt
    echo "== [$(since) s] times $cfg"
    timeout "$secs" $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 2 --time \
      --variants "$variants" > "$log" 2>&1
    grep -E "ms|rel|rror" "$log" | tail -12
  done
}

# wgrad_ncu SECONDS CONFIG VARIANTS LAUNCHES: Nsight Compute (--set full, clocks not locked) of
# the first LAUNCHES weight-gradient GEMMs (kind 10 and CUTLASS's) of wgrad_kernels.py, log in
# $OUT/ncu-<config>.txt; prints the headline metrics.
wgrad_ncu() {
  local secs=$1 cfg=$2 variants=$3 launches=$4 log=$OUT/ncu-${2//,/_}.txt
  echo "== [$(since) s] ncu $cfg"
  timeout "$secs" ncu --clock-control none --set full -k "regex:gather_wgrad|device_kernel" \
    --launch-count "$launches" --page details --print-units base \
    $PY benchmarks/wgrad_kernels.py --config "$cfg" --iters 1 --variants "$variants" \
    > "$log" 2>&1
  grep -E "gather_wgrad_kernel|device_kernel|^    Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |highest-utilized|rel\(" \
    "$log" | cut -c1-160 | head -70
}

# h200_bench TOTAL_S TAG: the layer benchmark of pallas and ffi at the configs that miss a
# target in the README ($BENCH_CONFIGS; DeepSeek-V3-like needs the H200's memory), on an H200
# only (the README table's rows are H200 rows).
h200_bench() {
  if grep -q H200 "$OUT/gpu.txt"; then
    BACKENDS=pallas,ffi layer_bench "$1" "$2" \
      ${BENCH_CONFIGS:-paper-7B-n256 paper-1.4B-n512 paper-120B-n512 paper-120B-n1024 \
        paper-30B-n512 paper-1.4B-n256 paper-30B-n256 paper-120B-n2048 DeepSeek-V3-like}
  else
    echo "not an H200: skipped"
  fi
}

# layer_gradient_tests SECONDS: the Pallas layer gradients against the float32 reference at
# real sizes and the router's mean-probability gradients on the GPU.
layer_gradient_tests() {
  gpu_tests "$1" tests/test_pallas_backward.py tests/test_router_top_k.py \
    -k "test_gpu_layer_gradients_match_float32 or test_gpu_route_mean_probs"
  tail -n 3 "$OUT/gpu-tests.log" | cut -c1-200
}
