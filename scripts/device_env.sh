# Sourced by the scripts/h200_*.sh device-call scripts (run from the repository root): the start
# they share. Sets T0 and PY, the environment (unbuffered Python, no GPU memory preallocation,
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
# begin_call: the common start of a device call: $OUT created, the carried wheels in .whl
# installed, the GPU's name, driver and clock recorded in $OUT/gpu.txt.
begin_call() {
  mkdir -p "$OUT"
  install_wheels .whl
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
}
