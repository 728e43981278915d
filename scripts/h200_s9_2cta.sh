#!/usr/bin/env bash
# Session 9, device call 4: dh with two CTAs per SM (64-column n tiles, 104.5 KiB of SMEM each,
# a 264-CTA persistent grid) so one CTA's epilogue overlaps the other's K loop; per-kernel
# times of the layer step (benchmarks/kernel_profile.py), gradients against the default's.
#   run(command="bash scripts/h200_s9_2cta.sh", carry=[".whl"], timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_2cta_out}
mkdir -p "$OUT"
install_wheels .whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
BN64=dh.block_n=64:dh.epi_n=64:dh.max_concurrent_steps=3
timeout "${PROF_S:-330}" $PY benchmarks/kernel_profile.py --out-dir "$OUT" --iters 10 \
  --configs "${PROF_CONFIGS:-paper-1.4B-n512,paper-7B-n512,paper-30B-n1024,paper-120B-n1024}" \
  --variants "${PROF_VARIANTS:-pallas,pallas::$BN64:dh.num_sms=264,pallas::$BN64}" --min-ms 0.2 2>&1 \
  | tee "$OUT/profile.log" | grep -E "^==|^  (pallas|xla)|Error" | cut -c1-160
grep -E "^  --|body_" "$OUT/profile.log" | cut -c1-100 | head -n 80
echo "== [$(since) s] done"
