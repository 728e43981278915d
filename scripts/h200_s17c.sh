#!/usr/bin/env bash
# Prepared in session 17, call 3 (independent of calls 1-2): the ffi schedule sweep at the n = 256
# paper configs, where the ffi backend is furthest below the paper (0.83-0.92x, session 12) and
# which the sweeps of sessions 2-6 never covered (their MEASURED table holds n = 512 / 1024
# shapes only; every other shape runs the kind's default, cooperative 128x256). Small-K GEMMs
# (down_proj with K = n = 256) are where a ping-pong schedule, which overlaps one tile's epilogue
# with the next tile's mainloop, may win. Prints the MEASURED entries to add to schedules.py and
# the layer with the default table against the swept one.
#   run(command="bash scripts/h200_s17c.sh", carry=["sonic_jax/ffi/libsonic_jax_cuda.so"])
set -uo pipefail
source scripts/device_env.sh
OUT=${OUT:-$PWD/s17c_out}
begin_call
for cfg in ${SWEEP_CONFIGS:-40960,768,256,128,8 24576,1536,256,128,8 32768,4096,256,256,16}; do
  ffi_sweep "${SWEEP_S:-180}" "sweep-${cfg//,/-}" "x[0-9.]+ \||layer|MEASURED" --configs "$cfg"
done
echo "== [$(since) s] done"
