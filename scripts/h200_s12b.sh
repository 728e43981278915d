#!/usr/bin/env bash
# Session 12, device call 2:
#   1. kernel_profile.py at paper-1.4B-n256 and paper-7B-n256 (the two configs furthest below the
#      paper, 0.88x, both in the backward): the in-kernel-gather dh on the row-split 128 x 256
#      tile (6 x 32 and 3 x 64 stages) and with two CTAs per SM, against the default and the
#      dispatch-fed kernels (pallas:xla);
#   2. kernel_profile.py at DeepSeek-V3-like (the one config below the original SonicMoE; the
#      profiler now runs fewer calls per round where 5 calls' outputs do not fit), with up_proj
#      fed by the dispatch;
#   3. the ffi scatter's GPU tests and the dispatch benchmark with the ffi gather / scatter;
#   4. memory_report.py at paper-1.4B-n512 and -n1024, the two configs over the original's memory,
#      with the dispatch (default) and with the in-kernel gathers.
#   run(command="bash scripts/h200_s12b.sh", carry=[".whl", "sonic_jax/ffi/libsonic_jax_cuda.so"],
#       timeout_s=600)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s12b_out}
begin_call
R6=dh.block_n=256:dh.block_k=32:dh.epi_n=64:dh.max_concurrent_steps=6:dh.num_consumers=2:dh.consumer_split=m:dh.h_source=gmem:dh.epi_buffers=2
R3=$R6:dh.block_k=64:dh.max_concurrent_steps=3
C2=dh.block_n=64:dh.ctas_per_sm=2:dh.max_concurrent_steps=3
UPX=up_proj.gather=xla:up_proj.cross_tile=true
echo "== [$(since) s] kernel profile (n = 256)"
timeout "${PROF1_S:-200}" $PY benchmarks/kernel_profile.py --out-dir "$OUT/p256" --iters 5 --rounds 3 \
  --configs paper-1.4B-n256,paper-7B-n256 --variants "pallas,pallas::$R6,pallas::$R3,pallas::$C2,pallas:xla" \
  --min-ms 0.1 > "$OUT/profile-n256.log" 2>&1
grep -E "^==|^  (pallas|xla)|^  --|body|Error|failed" "$OUT/profile-n256.log" | cut -c1-150
echo "== [$(since) s] kernel profile (DeepSeek-V3-like)"
timeout "${PROF2_S:-130}" $PY benchmarks/kernel_profile.py --out-dir "$OUT/pds" --iters 5 --rounds 3 \
  --configs deepseek-v3-like --variants "pallas,pallas::$UPX" --min-ms 0.3 \
  > "$OUT/profile-deepseek.log" 2>&1
grep -E "^==|^  (pallas|xla)|^  --|^  [0-9]+ calls|body|fusion|Error|failed" "$OUT/profile-deepseek.log" | cut -c1-150
gpu_tests "${TEST_S:-120}" tests/test_ffi.py -k "scatter"
echo "== [$(since) s] dispatch bench"
timeout "${DISP_S:-60}" $PY benchmarks/dispatch_bench.py --out-dir "$OUT" \
  --configs "paper-120B-n1024,OLMoE-1B-7B,Mixtral-8x7B" \
  --variants "xla,pallas_triton:scatter:1x2048:w4,ffi:gather,ffi:scatter" \
  > "$OUT/dispatch.log" 2>&1
grep -E "^==|^  [a-z_:0-9x-]+ +[0-9.]+ ms|rror" "$OUT/dispatch.log" | cut -c1-150
echo "== [$(since) s] memory report"
timeout "${MEM_S:-70}" $PY benchmarks/memory_report.py --out-dir "$OUT/mem" --rows 10 \
  --configs paper-1.4B-n512,paper-1.4B-n1024 --variants pallas,pallas:fused > "$OUT/memory-report.log" 2>&1
grep -E "^== |GiB" "$OUT/memory-report.log" | head -60 | cut -c1-170
echo "== [$(since) s] done"
