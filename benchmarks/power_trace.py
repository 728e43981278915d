"""The GPU's power, clocks and throttle reasons under a sustained layer step, and the step's kernels
timed cold (after an idle pause) and hot (right after the sustained load).

Session 35's H200 runs took 1-9 % longer than earlier sessions' at the configs whose step lasts
17 ms and more, for both backends (the pallas GEMM kernels unchanged), and the ffi down_proj at
paper-30B-n256 took 3.03 ms inside the step against 2.44 ms alone in the schedule sweep. This
program asks whether the clock drops under load (nvidia-smi's clocks_event_reasons: SW power
cap, HW slowdown, thermal) and which kernels pay for it. Needs a GPU and nvidia-smi.

  python benchmarks/power_trace.py --config paper-30B-n256 --variant ffi --seconds 20 \\
      --out-dir /tmp/power

Prints the nvidia-smi samples summarized per second of load (median power, SM clock, memory
clock, temperature and the throttle reasons seen) and, per kernel from --min-ms up, the cold and
hot CUPTI medians and their ratio; writes the raw samples (smi.csv) and a JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sonic_jax.bench.gpu_state import SmiSampler, summarize


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="paper-30B-n256")
  ap.add_argument("--variant", default="ffi",
                  help="a sonic_jax.bench.variants spec (ffi, pallas, ffi:..., ...)")
  ap.add_argument("--seconds", type=float, default=20.0, help="sustained load")
  ap.add_argument("--rest-s", type=float, default=5.0, help="idle pause before the cold timing")
  ap.add_argument("--iters", type=int, default=3, help="CUPTI-timed steps, cold and hot")
  ap.add_argument("--sample-ms", type=int, default=50)
  ap.add_argument("--min-ms", type=float, default=0.1)
  ap.add_argument("--out-dir", default="power_trace_out")
  args = ap.parse_args(argv)
  import jax
  from jax.experimental.mosaic.gpu import profiler

  from sonic_jax.bench.configs import parse_configs
  from sonic_jax.bench.problems import make_problem
  from sonic_jax.bench.runner import fwdbwd_step
  from sonic_jax.bench.timing import kernel_medians
  from sonic_jax.bench.variants import layer_for

  if jax.devices()[0].platform != "gpu":
    raise SystemExit("power_trace.py needs a GPU (CUPTI and nvidia-smi)")
  os.makedirs(args.out_dir, exist_ok=True)
  (cfg,) = parse_configs([args.config])
  prob = make_problem(cfg, seed=0)
  fn = jax.jit(fwdbwd_step(layer_for(args.variant, cfg.d, cfg.n, cfg.K)))
  jax.block_until_ready(fn(*prob.args, prob.dout))

  def kernels(iters: int) -> list[tuple[str, float]]:
    _, timings = profiler.measure(fn, aggregate=False, iterations=iters)(*prob.args, prob.dout)
    names, med, _, _ = kernel_medians(timings if iters > 1 else [timings])
    return list(zip(names, med))

  smi = SmiSampler.start(period_ms=args.sample_ms, path=os.path.join(args.out_dir, "smi.csv"))
  if smi is None:
    raise SystemExit("power_trace.py needs nvidia-smi on PATH")
  try:
    t_start = time.time()
    time.sleep(args.rest_s)
    t_cold = time.time()
    cold = kernels(args.iters)
    t_load = time.time()
    steps, pending = 0, []
    while time.time() - t_load < args.seconds:
      pending.append(fn(*prob.args, prob.dout))
      steps += 1
      if len(pending) > 2:  # keep the queue short: each step's outputs hold its gradients
        jax.block_until_ready(pending.pop(0))
    jax.block_until_ready(pending)
    del pending
    t_hot = time.time()
    hot = kernels(args.iters)
    t_end = time.time()
  finally:
    smi.stop()
  rows = smi.rows()
  phases = {"idle": summarize(rows, t_start, t_cold, width=t_cold - t_start),
            "cold_timing": summarize(rows, t_cold, t_load, width=1e9),
            "load": summarize(rows, t_load, t_hot),
            "hot_timing": summarize(rows, t_hot, t_end, width=1e9)}
  step_ms = (t_hot - t_load) / max(steps, 1) * 1e3
  print(f"== {cfg.name} {cfg.shape} {args.variant}: {steps} steps in {t_hot - t_load:.1f} s "
        f"({step_ms:.2f} ms wall each); {len(rows)} nvidia-smi samples")
  for name, wins in phases.items():
    for w in wins:
      print(f"  {name:10s} t+{w['t']:5.1f}s  {w['power_w']:6.1f} W  SM {w['sm_mhz']:5.0f} MHz  "
            f"mem {w['mem_mhz']:5.0f} MHz  {w['temp_c']:3.0f} C  {','.join(w['reasons'])}")
  cold_total, hot_total = sum(t for _, t in cold), sum(t for _, t in hot)
  print(f"  step kernels: cold {cold_total:.3f} ms, hot {hot_total:.3f} ms "
        f"(x{hot_total / cold_total:.3f})")
  same_list = [k for k, _ in cold] == [k for k, _ in hot]
  if same_list:
    for i, ((nm, tc), (_, th)) in enumerate(zip(cold, hot)):
      if max(tc, th) >= args.min_ms:
        print(f"    {i:3d} cold {tc:7.3f}  hot {th:7.3f}  x{th / tc:.3f}  {nm[:60]}")
  else:
    print("  (cold and hot launched different kernel lists; see the JSON)")
  with open(os.path.join(args.out_dir, "power_trace.json"), "w") as f:
    json.dump({"config": cfg.name, "shape": cfg.shape, "variant": args.variant,
               "device": jax.devices()[0].device_kind, "steps": steps, "step_wall_ms": step_ms,
               "phases": phases, "cold": cold, "hot": hot, "args": vars(args)}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
