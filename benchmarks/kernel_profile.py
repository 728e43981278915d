"""Per-kernel GPU time of one layer step (forward+backward), variant against variant.

Runs the step the layer benchmark times (``jax.vjp`` of ``sonic_jax.moe``, its output and its
backward with a cotangent) under CUPTI (``mosaic.gpu.profiler.measure(aggregate=False)``) and
prints each kernel's median time over the iterations, in launch order, for every variant, so a
difference between two totals can be pinned on the kernels that cause it. The variants take
turns in rounds (the GPU's clock drops under sustained load), and only iterations with the usual
kernel list are compared kernel by kernel. Each variant's line gives its per-round totals and
its drift against the first variant (the median time ratio of the kernels both launch at the
same position, from --min-ms up): a kernel's gain counts only beyond that. Needs a GPU.

  python benchmarks/kernel_profile.py --configs paper-1.4B-n512 \
      --variants pallas,pallas::dw1-early --iters 10 --out-dir /tmp/prof

Variants (``sonic_jax.bench.variants``): ``pallas[:<backward_gathers>][:<option>...]``, options
``dw1-early``, ``dh-ring`` and ``<kernel>.<field>=<value>`` over the kernel's default config, e.g.
``pallas::up_proj.block_k=32`` or ``pallas::dh.block_n=64:dh.ctas_per_sm=2``. A variant ending in
``@<route path>`` runs one of the paths ``sonic_jax.moe`` took before
(``sonic_jax.bench.variants.layer_for``): ``@saved-logits``, ``@two-step`` or
``@recomputed-router``, e.g. ``pallas,pallas@two-step``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _short(name: str, width: int = 48) -> str:
  return name if len(name) <= width else name[: width - 1] + "…"


def _drift(ref_rows: list[tuple[str, float]], rows: list[tuple[str, float]],
           min_ms: float) -> tuple[float, int]:
  """How much slower ``rows`` ran than ``ref_rows`` overall: the median of t / t_ref over the
  kernels at the same launch index with the same name and at least ``min_ms`` in both, and
  their count ((nan, 0) when none match). Between variants of one run the H200 moved kernels
  that no option touches by up to 9 % (session 13), so a single kernel's gain only counts beyond
  this; a median leaves out the one or two kernels a variant changes."""
  ratios = [t / t0 for (nm0, t0), (nm, t) in zip(ref_rows, rows)
            if nm == nm0 and t0 >= min_ms and t >= min_ms]
  if not ratios:
    return float("nan"), 0
  return statistics.median(ratios), len(ratios)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="paper-1.4B-n512")
  ap.add_argument("--variants", default="pallas,pallas::dw1-early")
  ap.add_argument("--iters", type=int, default=10, help="timed calls per variant and round")
  ap.add_argument("--rounds", type=int, default=3,
                  help="rounds in which the variants take turns (medians over all rounds)")
  ap.add_argument("--outputs-gib", type=float, default=24.0,
                  help="fewer calls per round where the outputs of --iters calls exceed this")
  ap.add_argument("--out-dir", default="kernel_profile_out")
  ap.add_argument("--min-ms", type=float, default=0.01,
                  help="print kernels from this time up; the rest as one sum (all in the JSON)")
  args = ap.parse_args(argv)
  import jax

  from sonic_jax.bench.gpu_state import SmiSampler

  if jax.devices()[0].platform != "gpu":
    raise SystemExit("kernel_profile.py needs a GPU (CUPTI)")
  os.makedirs(args.out_dir, exist_ok=True)
  records = []
  # Each round's SM clock (nvidia-smi in the background; none without it): the rounds of one
  # variant differed by up to 9 % in session 35, and only the clock can say whether it moved.
  smi = SmiSampler.start(period_ms=50)
  try:
    _profile(args, records, smi)
  finally:
    if smi is not None:
      smi.stop()
  with open(os.path.join(args.out_dir, "kernel_profile.json"), "w") as f:
    json.dump(records, f, indent=1)
  return 0


def _profile(args, records: list, smi) -> None:
  """The profile of every config and variant of ``args``, appended to ``records``."""
  import jax
  from jax.experimental.mosaic.gpu import profiler

  from sonic_jax.bench.configs import parse_configs
  from sonic_jax.bench.problems import make_problem
  from sonic_jax.bench.runner import fwdbwd_step, rel_errs
  from sonic_jax.bench.timing import kernel_medians
  from sonic_jax.bench.variants import layer_for

  for cfg in parse_configs(args.configs.split(",")):
    prob = make_problem(cfg, seed=0)
    fns, errs_of, ref_grads = {}, {}, None
    iters = args.iters
    for spec in args.variants.split(","):
      try:
        layer = layer_for(spec, cfg.d, cfg.n, cfg.K)
        fn = jax.jit(fwdbwd_step(layer))
        step_out = jax.block_until_ready(fn(*prob.args, prob.dout))
      except (Exception, SystemExit) as e:  # one variant that does not build must not end it
        print(f"  {spec}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        records.append({"config": cfg.name, "shape": cfg.shape, "variant": spec,
                        "error": f"{type(e).__name__}: {e}"[:2000]})
        continue
      # measure() keeps every iteration's outputs alive until the last one finishes: at
      # DeepSeek-V3-like sizes (22 GiB of weight gradients per call) 5 iterations do not fit.
      out_bytes = sum(a.nbytes for a in jax.tree.leaves(step_out))
      iters = max(1, min(iters, int(args.outputs_gib * 2**30 // out_bytes)))
      grads = step_out[1]
      del step_out
      if ref_grads is None:
        ref_grads, errs_of[spec] = grads, {}
      else:  # against the first variant: a faster variant must compute the same gradients
        errs_of[spec] = dict(zip(("dx", "drouter", "dw1", "dw2"), map(float, jax.device_get(
            rel_errs(tuple(grads), tuple(ref_grads))))))
      del grads
      fns[spec] = fn
    # Variants take turns, round by round: a sustained GEMM load lowers the H200's clock over
    # seconds (session 11: unchanged kernels 3-9 % slower in the 2nd-4th variant of a
    # one-after-the-other profile), so a later variant must not be the only one timed hot.
    samples = {spec: [] for spec in fns}
    round_totals = {spec: [] for spec in fns}
    round_windows = {spec: [] for spec in fns}  # (start, stop) of each round's timing
    if iters < args.iters:
      print(f"  {iters} calls per round (the outputs of {args.iters} exceed "
            f"--outputs-gib {args.outputs_gib})", flush=True)
    for _ in range(args.rounds):
      for spec, fn in fns.items():
        t0 = time.time()
        _, timings = profiler.measure(fn, aggregate=False, iterations=iters)(
            *prob.args, prob.dout)
        round_windows[spec].append((t0, time.time()))
        if iters == 1:  # measure() returns one call's list unwrapped
          timings = [timings]
        samples[spec].extend(timings)
        round_totals[spec].append(statistics.median(sum(t for _, t in it) for it in timings))
    # The rounds' GPU states, read once all rounds ran (no pause between timings).
    round_states = {spec: smi.intervals(w) if smi is not None else [None] * len(w)
                    for spec, w in round_windows.items()}
    per_variant = {}
    for spec, timings in samples.items():
      names, med, total, kept = kernel_medians(timings)
      per_variant[spec] = list(zip(names, med))
      errs = errs_of[spec]
      first = next(iter(per_variant.values()))
      drift, n_drift = _drift(first, per_variant[spec], args.min_ms)
      records.append({"config": cfg.name, "shape": cfg.shape, "variant": spec,
                      "kernels": per_variant[spec], "total_ms": total, "rel_vs_first": errs,
                      "round_totals_ms": round_totals[spec],
                      "round_gpu_states": round_states[spec], "drift_vs_first": drift,
                      "drift_kernels": n_drift, "rounds": args.rounds,
                      "iters_per_round": iters, "iterations_kept": kept,
                      "iterations": len(timings)})
      rounds = "/".join(f"{t:.3f}" for t in round_totals[spec])
      clocks = [st["sm_mhz"] for st in round_states[spec] if st and st.get("sm_mhz")]
      if clocks:
        rounds += " at " + "/".join(f"{c:.0f}" for c in clocks) + " MHz"
      print(f"  {spec}: {total:.3f} ms" + "".join(f"  rel_{k}={v:.2g}" for k, v in errs.items())
            + f"  rounds {rounds}"
            + (f"  drift x{drift:.3f} ({n_drift} kernels)" if per_variant[spec] is not first
               else "")
            + (f"  ({kept} of {len(timings)} iterations had the usual kernel list)"
               if kept < len(timings) else ""), flush=True)
    del fns
    print(f"== {cfg.name} {cfg.shape}: kernel ms, median of {args.rounds} x {iters} "
          f"(variants interleaved), launch order")
    for spec, rows in per_variant.items():
      print(f"  -- {spec}: {len(rows)} kernels, total {sum(t for _, t in rows):.3f} ms")
      small = [t for _, t in rows if t < args.min_ms]
      for i, (nm, t) in enumerate(rows):
        if t >= args.min_ms:
          print(f"    {i:3d} {t:8.3f}  {_short(nm)}")
      print(f"        {sum(small):8.3f}  ({len(small)} kernels under {args.min_ms} ms each)")
  with open(os.path.join(args.out_dir, "kernel_profile.json"), "w") as f:
    json.dump(records, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
