#!/usr/bin/env bash
# Next device call (prepared in session 10, not yet run): what session 10 left unmeasured on the
# ordered training step (runner.fwdbwd_step: output and cotangent through a barrier).
#   1. benchmarks/memory_report.py (compile only) of pallas on the 7 configs session 10's memory
#      report did not reach; the XLA dump stays in /tmp;
#   2. the layer benchmark of the JAX baselines recorded only on the old gradients-only step
#      (mgpu-grouped, tokamax, dense-ceiling; README mark †) and of xla / lax-ragged where they
#      fit, with the seconds left.
#   run(command="bash scripts/h200_s11_baselines.sh", carry=[".whl", ".gpu_wheels"],
#       timeout_s=600)
# .gpu_wheels: /work/shared/tools/gpu-wheels tokamax .gpu_wheels (git-ignored).
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s11_baselines_out}
begin_call
install_wheels .gpu_wheels
echo "== [$(since) s] memory report"
timeout "${MEM_S:-150}" $PY benchmarks/memory_report.py --out-dir /tmp/mem --rows 6 \
  --configs "${MEM_CONFIGS:-paper-1.4B-n256,paper-1.4B-n1024,paper-7B-n512,paper-7B-n1024,olmoe-1b-7b,mixtral-8x7b,deepseek-v3-like}" \
  --variants pallas > "$OUT/memory-report.log" 2>&1
grep -E "^== " "$OUT/memory-report.log" | cut -c1-160
BACKENDS=${BACKENDS:-xla} BASELINES=${BASELINES:-mgpu-grouped,tokamax,lax-ragged,dense-ceiling} \
  layer_bench "${TOTAL_S:-580}" "${BENCH_TAG:-s11-baselines}" ${CONFIGS:-paper presets 4096,1024,512,16,2}
echo "== [$(since) s] done"
