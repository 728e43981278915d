#!/usr/bin/env bash
# Session 30's device calls (carry the built library, ABI 14: sonic_jax/ffi/libsonic_jax_cuda.so).
# PART=ncu (any Hopper GPU): Nsight Compute on down_proj's grouped GEMM at paper-30B-n512
#   (P = 262144, K = n = 512, N = d = 4096, E = 128) under the default (CUTLASS cooperative
#   128x256 without a cluster) and config 14 (our TMA_AB_128x256_C1, 2x slower there on the
#   H100 in session 30's first call): where config 14 loses (stall reasons, memory traffic).
#   Reports in $OUT/ncu-*.txt.
#   run(command="PART=ncu bash scripts/device_s30.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
# PART=dhprof (any Hopper GPU): kernel profile of the step with gather_schedule tma_b against
#   auto (dh's gathered GEMM under config 13, tma_b_c1); at d 4096 also dh (and dW2) in
#   the GEMM, which the defaults leave to scatter_rows + CUTLASS there (PROF_BIG=configs; off
#   by default: session 22 measured dh and dW2 in the GEMM 0.9 ms slower at 120B-n1024 on
#   the H100, more than config 13 saves on dh).
# PART=epi (any Hopper GPU): the bf16 epilogues of csrc/gather_gemm.cuh storing whole 32-byte
#   sectors: their GPU tests, config 14's sweep at 30B-n512 and the
#   fused-gather sweep at 120B-n1024.
# PART=bench|gather|sweep|tests|prof|tma: as scripts/device_s29.sh.
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s30_out}
begin_call
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
  --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for part in ${PART//,/ }; do
case $part in
ncu)
  shape=${NCU_SHAPE:-262144,512,4096,128}
  for spec in ${NCU_RUNS:-VARLEN_M_NN_BF16:COOPERATIVE_128x256_C1x1:device_kernel VARLEN_M_NN_BF16:TMA_AB_128x256_C1:gather_gemm_kernel}; do
    IFS=: read -r kind cfg kern <<< "$spec"
    echo "== [$(since) s] ncu $kind $cfg"
    timeout "${NCU_S:-150}" ncu --clock-control none --import-source no -k "regex:$kern" -c 1 \
      $SECTIONS $PY benchmarks/ncu_gemm.py --kind "$kind" --shape "$shape" --configs "$cfg" \
      > "$OUT/ncu-$kind-$cfg.txt" 2>&1
    grep -E "stalled_(long|barrier|wait|math|mio|lg_|short|sleep|dispatch|no_inst|membar|branch|tex|drain|imc|selected|not_sel)|Duration|Throughput|Registers|Shared Memory Config|Achieved Occupancy|Stall|One or More|No Eligible|Issued Warp|L2 Hit|Mem Busy|Max Bandwidth|DRAM|wall|Error|error" \
      "$OUT/ncu-$kind-$cfg.txt" | head -n 40 | cut -c1-160
  done
  ;;
dhprof)
  # dh's in-GEMM gather without the cluster (config 13: 3.42 against 3.78 ms isolated at
  # 120B-n1024 on the H100, session 30) inside the step: where dh gathers by default (n 256),
  # gather_schedule tma_b against auto; at d 4096, n >= 512 also dh in the GEMM with and
  # without dW2 in the GEMM (no scatter of dO at all with both).
  AUTO=gather_schedule=auto
  PROF_TAG=dh kernel_profile "${PROF_S:-150}" "${PROF_SMALL:-paper-7B-n256,paper-1.4B-n256}" \
    "ffi:gather_schedule=tma_b,ffi:$AUTO" 0.05
  [[ -n "${PROF_BIG:-}" ]] && PROF_TAG=dhbig kernel_profile "${PROF_BIG_S:-250}" "$PROF_BIG" \
    "ffi,ffi:fused-gather=dh:$AUTO,ffi:fused-gather=dh:wgrad-gather=dw2:$AUTO" 0.05
  ;;
epi)
  # The bf16 epilogues storing whole sectors (store_quad_16cols): the GPU tests of every kernel
  # they touch, then config 14 at 30B-n512 and the in-GEMM gather kinds at 120B-n1024.
  gpu_tests "${TEST_S:-200}" tests/test_ffi.py -k "TMA_AB or (GATHER_TMA_B and \
(gathered_gemm_matches or fused_epilogue_kernels_match)) or (gathered_varlen_k_matches and \
TMA_256x128_C2x1) or fused_gather_entry_points or test_backward_entry_points or \
fused_epilogue_entry_points or (test_layer_forward_backward and topk and (all_gathers_fused or \
fused_dh or wgrad_gather or (fused_epilogue and not noinc and not cp_async)))"
  ffi_sweep "${SWEEP_S:-90}" epi-tma "^config|  (down_proj|up_proj|dx_pairs|dw1|dw2)" \
    --gemms-only --only-schedules TMA_AB_128x256_C1 --configs 32768,4096,512,128,8
  ffi_sweep "${GATHER_S:-120}" epi-gather "^config|  (up_proj|dh|layer)" \
    --fused-gather-only --configs 32768,4096,1024,128,8
  ;;
bench|gather|sweep|tests|prof|tma)
  OUT=$OUT PART=$part bash scripts/device_s29.sh | grep -v "^== \[.*\] done"
  ;;
*) echo "unknown PART $part" ;;
esac
done
echo "== [$(since) s] done"
