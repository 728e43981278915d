#!/usr/bin/env bash
# Session 9, device call 4: dh with two CTAs per SM (64-column n tiles, 104.5 KiB of SMEM each,
# a 264-CTA persistent grid) so one CTA's epilogue overlaps the other's K loop; per-kernel
# times of the layer step (benchmarks/kernel_profile.py), gradients against the default's.
#   run(command="bash scripts/h200_s9_2cta.sh", carry=[".whl"], timeout_s=420)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s9_2cta_out}
begin_call
BN64=dh.block_n=64:dh.epi_n=64:dh.max_concurrent_steps=3
kernel_profile "${PROF_S:-330}" \
  "${PROF_CONFIGS:-paper-1.4B-n512,paper-7B-n512,paper-30B-n1024,paper-120B-n1024}" \
  "${PROF_VARIANTS:-pallas,pallas::$BN64:dh.num_sms=264,pallas::$BN64}" 0.2
echo "== [$(since) s] done"
