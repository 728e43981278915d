#!/usr/bin/env bash
# Session 14, call 3:
#   1. GPU tests: dh with DhConfig.h_lookahead (new: chunk 0's H loads after the K loop's last
#      wgmma, chunk c + 1's with chunk c) on the 128 x 256 row-split tile against xla;
#   2. kernel_profile.py: the default against dh.h_lookahead at d = 4096 (paper-120B-n1024) and
#      d = 1536 (paper-7B-n256), and at DeepSeek-V3-like (0.93x the original SonicMoE) also the
#      ffi backend, kernel by kernel.
#   run(command="bash scripts/h200_s14c.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"], timeout_s=480)
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s14c_out}
begin_call
gpu_tests "${TEST_S:-120}" tests/test_pallas_backward.py -k "lookahead"
PROF_ROUNDS=${PROF_ROUNDS:-3} kernel_profile "${PROF_S:-330}" \
  paper-120B-n1024,paper-7B-n256,deepseek-v3-like "pallas,pallas::dh.h_lookahead=true,ffi" 0.3
echo "== [$(since) s] done"
