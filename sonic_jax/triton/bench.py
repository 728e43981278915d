"""GPU timing of the routing / metadata / combine kernels against XLA (and the Mosaic combine).

  python -m sonic_jax.triton.bench --out DIR

Times with sonic_jax.bench.timing (on a GPU: CUPTI, the sum of kernel times per call; elsewhere
the wall clock), after warm-up, median of --iters; random data. Checks each variant against the
xla path before timing it (metadata bit-exact, combine by relative error). Writes
DIR/triton-bench.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax import routing
from sonic_jax import triton as tri
from sonic_jax.bench.timing import compile_and_time, on_gpu
from sonic_jax.routing import RoutingPlan

ROUTING_CONFIGS = [(32768, 128, 8), (32768, 128, 16), (32768, 256, 8), (32768, 256, 16),
                   (24576, 128, 8)]  # the last: the paper's 7B (n = 256) shape
COMBINE_CONFIGS = [(24576, 128, 8, 1536), (32768, 256, 16, 4096)]  # paper 7B / 30B shapes
TOPK_SWEEP = False
TIME_XLA = True
_FIELDS = ("group_sizes", "group_offsets", "gather_idx", "scatter_idx", "reverse_idx")


def _time(fn, args, iters, warmup=3):
  """(median, min, max) ms: sonic_jax.bench.timing (CUPTI kernel sum on a GPU, else wall)."""
  t = compile_and_time(fn, args, iters=iters, warmup=warmup, keep_out=False).timing
  if t.timer != "cupti" and on_gpu():
    raise RuntimeError(f"no GPU-side timing: {t.note}")
  return t.median_ms, min(t.samples_ms), max(t.samples_ms)


def _rel(a, b):
  a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
  if not (np.isfinite(a).all() and np.isfinite(b).all()):
    return float("inf")
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _record(rows, log, **row):
  rows.append(row)
  print(json.dumps(row), file=log, flush=True)


def copy_bandwidth(iters):
  """Best of two streaming kernels (read + write of 1 GiB): bf16 x*2 and f32 x*2."""
  n = (1 << 29) if jax.devices()[0].platform == "gpu" else (1 << 16)
  best = {}
  for dtype in (jnp.bfloat16, jnp.float32):
    x = jax.random.normal(jax.random.key(0), (n * 2 // jnp.dtype(dtype).itemsize,),
                          jnp.float32).astype(dtype)
    med, _, _ = _time(lambda a: a * 2, (x,), iters)
    best[jnp.dtype(dtype).name] = 2 * x.nbytes / (med * 1e-3) / 1e12
    del x
  return max(best.values()), best


def bench_routing(rows, log, iters, impls):
  for (t, e, k) in ROUTING_CONFIGS:
    logits = jax.random.normal(jax.random.key(t + e + k), (t, e), jnp.float32)
    ref_plan = jax.jit(lambda l: routing.route_logits(l, top_k=k))(logits)
    tokens = jnp.repeat(jnp.arange(t, dtype=jnp.int32), k)
    experts, scores = ref_plan.expert_ids, ref_plan.scores
    ref_topk = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
    base = dict(kind="routing", T=t, E=e, K=k)
    variants = {
        ("full", "xla"): (lambda l: routing.route_logits(l, top_k=k), (logits,)),
        ("topk", "xla"): (lambda l: jax.lax.top_k(jax.nn.softmax(l, axis=-1), k), (logits,)),
        ("meta", "xla"): (lambda a, b, c: RoutingPlan.from_assignments(
            a, b, c, num_tokens=t, num_experts=e, top_k=k), (tokens, experts, scores)),
    }
    try:
      from sonic_jax.pallas.tiles import make_tiles
      variants[("tiles", "xla")] = (lambda gs, go: make_tiles(
          gs, go, block_m=128, align=8, capacity=t * k), (ref_plan.group_sizes,
                                                          ref_plan.group_offsets))
    except Exception:  # noqa: BLE001 - the tile helper belongs to the pallas backend
      pass
    for impl in impls:
      variants[("full", impl)] = (
          lambda l, impl=impl: tri.route_logits(l, top_k=k, impl=impl), (logits,))
      if impl == "jax_triton":
        variants[("full_xla_topk", impl)] = (
            lambda l, impl=impl: tri.route_logits(l, top_k=k, impl=impl, topk_impl="xla"),
            (logits,))
      variants[("topk", impl)] = (
          lambda l, impl=impl: tri.topk_softmax(l, k, impl=impl), (logits,))
      for bt, nw in (((1, 1), (4, 4), (64, 8)) if TOPK_SWEEP else ()):
        cfg = tri.TopKConfig(block_t=bt, num_warps=nw)
        variants[(f"topk t{bt} w{nw}", impl)] = (
            lambda l, impl=impl, cfg=cfg: tri.topk_softmax(l, k, impl=impl, config=cfg),
            (logits,))
      for chunk, nw in ((32, 4), (64, 4), (128, 4)):
          cfg = tri.MetadataConfig(chunk=chunk, num_warps=nw)
          variants[(f"meta c{chunk} w{nw}", impl)] = (
              lambda a, b, c, impl=impl, cfg=cfg: tri.plan_from_assignments(
                  a, b, c, num_tokens=t, num_experts=e, top_k=k, impl=impl, config=cfg),
              (tokens, experts, scores))
    for (piece, impl), (fn, args) in variants.items():
      if impl == "xla" and not TIME_XLA:
        continue  # ref_plan / ref_topk above are the checks' references
      row = dict(base, piece=piece, impl=impl)
      try:
        out = jax.block_until_ready(jax.jit(fn)(*args))
        if piece.startswith("meta") or piece.startswith("full"):
          bad = [f for f in _FIELDS if not np.array_equal(np.asarray(getattr(out, f)),
                                                        np.asarray(getattr(ref_plan, f)))]
          row["check"] = "exact" if not bad else f"DIFF {bad}"
          row["scores_rel"] = _rel(out.scores, ref_plan.scores)
          if piece.startswith("full") and bad:
            rows_diff = int(np.sum(np.any(np.asarray(out.expert_ids).reshape(t, k) !=
                                          np.asarray(experts).reshape(t, k), axis=1)))
            row["check"] += f" (expert rows differing: {rows_diff})"
        elif piece.startswith("topk"):
          diff = int(np.sum(np.any(np.asarray(out[1]) != np.asarray(ref_topk[1]), axis=1)))
          row["check"] = f"rows differing {diff}"
          row["scores_rel"] = _rel(out[0], ref_topk[0])
        if impl != "xla" or TIME_XLA:
          row["ms"], row["ms_min"], row["ms_max"] = _time(fn, args, iters)
      except Exception as ex:  # noqa: BLE001 - record and go on
        row["error"] = f"{type(ex).__name__}: {ex}"[:600]
        traceback.print_exc(file=log)
      _record(rows, log, **row)


def bench_combine(rows, log, iters, impls, copy_tbs):
  from sonic_jax.xla_backend import XlaKernels
  for (t, e, k, d) in COMBINE_CONFIGS:
    logits = jax.random.normal(jax.random.key(7), (t, e), jnp.float32)
    plan = jax.jit(lambda l: routing.route_logits(l, top_k=k))(logits)
    y = jax.random.normal(jax.random.key(8), (plan.capacity, d), jnp.float32).astype(
        jnp.bfloat16)
    nbytes = (plan.capacity * d + t * d) * 2 + plan.capacity * 8
    for weighted in (True, False):
      s = plan.scores if weighted else None
      ref = jax.jit(lambda y_, p_: XlaKernels().combine(y_, p_, s, jnp.bfloat16))(y, plan)
      variants = {("xla", ""): lambda y_, p_: XlaKernels().combine(y_, p_, s, jnp.bfloat16)}
      try:
        from sonic_jax.pallas import combine as mosaic_combine
        from sonic_jax.pallas.configs import combine_config
        variants[("mosaic", "")] = lambda y_, p_: mosaic_combine.combine(
            y_, p_, s, jnp.bfloat16, config=combine_config(d, impl="mosaic"))
      except Exception:  # noqa: BLE001 - another team's kernel; optional here
        pass
      for impl in impls:
        sweep = (((1, 1024, 4), (2, 1024, 4), (4, 512, 4), (8, 256, 4))
                 if weighted else ((None, None, 4),))  # unweighted: the default config
        for bt, bd, nw in sweep:
          if bt is None:
            cfg = tri.CombineConfig()
            variants[(impl, "default")] = (
                lambda y_, p_, impl=impl, cfg=cfg: tri.combine(y_, p_, s, jnp.bfloat16,
                                                               impl=impl, config=cfg))
            continue
          if d % bd:
            bd = 512 if d % 512 == 0 else 256
          cfg = tri.CombineConfig(block_t=bt, block_d=bd, num_warps=nw)
          variants[(impl, f"t{bt} d{bd} w{nw}")] = (
              lambda y_, p_, impl=impl, cfg=cfg: tri.combine(y_, p_, s, jnp.bfloat16,
                                                             impl=impl, config=cfg))
      for (impl, cfg), fn in variants.items():
        if impl in ("xla", "mosaic") and not TIME_XLA:
          continue
        row = dict(kind="combine", T=t, E=e, K=k, d=d, weighted=weighted, impl=impl,
                   config=cfg, bytes=nbytes)
        try:
          out = jax.block_until_ready(jax.jit(fn)(y, plan))
          row["rel_err"] = _rel(out, ref)
          row["ms"], row["ms_min"], row["ms_max"] = _time(fn, (y, plan), iters)
          row["TBps"] = nbytes / (row["ms"] * 1e-3) / 1e12
          row["frac_copy"] = row["TBps"] / copy_tbs
        except Exception as ex:  # noqa: BLE001
          row["error"] = f"{type(ex).__name__}: {ex}"[:600]
          traceback.print_exc(file=log)
        _record(rows, log, **row)


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--iters", type=int, default=30)
  ap.add_argument("--skip", default="", help="comma list of: routing, combine")
  ap.add_argument("--impls", default=None, help="comma list (default: all that run here)")
  ap.add_argument("--routing-configs", default=None, help="T,E,K;T,E,K;...")
  ap.add_argument("--combine-configs", default=None, help="T,E,K,d;...")
  ap.add_argument("--topk-sweep", action="store_true", help="time TopKConfig variants too")
  ap.add_argument("--no-xla", action="store_true", help="check against xla, time only kernels")
  ap.add_argument("--cpu-smoke", action="store_true",
                  help="tiny shapes, xla variants only, wall clock: checks this script")
  args = ap.parse_args(argv)
  global ROUTING_CONFIGS, COMBINE_CONFIGS, TOPK_SWEEP, TIME_XLA
  if args.routing_configs:
    ROUTING_CONFIGS = [tuple(map(int, c.split(","))) for c in args.routing_configs.split(";")]
  if args.combine_configs:
    COMBINE_CONFIGS = [tuple(map(int, c.split(","))) for c in args.combine_configs.split(";")]
  TOPK_SWEEP = args.topk_sweep
  TIME_XLA = not args.no_xla
  if args.cpu_smoke:
    ROUTING_CONFIGS, COMBINE_CONFIGS = [(64, 12, 3)], [(64, 12, 3, 64)]
  import os
  os.makedirs(args.out, exist_ok=True)
  env = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             device=jax.devices()[0].device_kind, jax=jax.__version__,
             python=sys.version.split()[0], command=" ".join(sys.argv))
  try:
    import triton
    env["triton"] = triton.__version__
    import jax_triton
    env["jax_triton"] = jax_triton.__version__
  except Exception as ex:  # noqa: BLE001
    env["jax_triton_error"] = f"{type(ex).__name__}: {ex}"[:400]
  impls = [] if args.cpu_smoke else args.impls.split(",") if args.impls else [
      i for i in tri.IMPLS
      if (tri.jax_triton_unavailable_reason() if i == "jax_triton" else None) is None]
  env["impls"] = impls
  rows = []
  with open(os.path.join(args.out, "triton-bench.log"), "w") as log:
    print(json.dumps(env), file=log, flush=True)
    copy_tbs, copy_all = copy_bandwidth(args.iters)
    env["copy_TBps"], env["copy_TBps_by_dtype"] = copy_tbs, copy_all
    skip = set(args.skip.split(","))
    if "routing" not in skip:
      bench_routing(rows, log, args.iters, impls)
    if "combine" not in skip:
      bench_combine(rows, log, args.iters, impls, copy_tbs)
  with open(os.path.join(args.out, "triton-bench.json"), "w") as f:
    json.dump(dict(env=env, rows=rows), f, indent=1)
  print(json.dumps(env))
  print(f"copy bandwidth (x*2 over 1 GiB, best of bf16/f32): {copy_tbs:.2f} TB/s {copy_all}")
  for r in rows:
    key = (f"{r['kind'][:4]} T{r['T']} E{r['E']} K{r['K']}" + (f" d{r['d']}" if "d" in r else "")
           + (" w" if r.get("weighted") else (" u" if "weighted" in r else "")))
    what = f"{r['impl']}:{r.get('piece', r.get('config', ''))}"
    if "error" in r:
      print(f"{key:28s} {what:32s} ERROR {r['error'][:150]}")
      continue
    if "ms" not in r:
      print(f"{key:28s} {what:32s} (checked only) {r.get('check', r.get('rel_err', ''))}")
      continue
    extra = (f"{r['TBps']:.2f}TB/s {100 * r['frac_copy']:.0f}% rel {r['rel_err']:.1e}"
             if r["kind"] == "combine" else f"{r.get('check', '')} {r.get('scores_rel', '')}")
    print(f"{key:28s} {what:32s} {r['ms'] * 1e3:9.1f} us  {extra}")


if __name__ == "__main__":
  main()
