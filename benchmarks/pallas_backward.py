"""Pallas backward kernels (dh, dw1, dw2): correctness vs the xla backend and H200 timings.

  python benchmarks/pallas_backward.py [--out DIR] [--shape T,d,n,E,K] [--iters N]

1. Correctness at a medium shape (T=4096, d=1024, n=512, E=12 with one empty expert, K=4)
   against sonic_jax.xla_backend.XlaKernels: dS, dH, A', dW1, dW2 relative errors, and
   bit-identical repeated runs.
2. At the benchmark shape (default T=32768, d=4096, n=1024, E=128, K=8): a float32 spot check
   of three experts, then GPU-side timings (CUPTI via mosaic.gpu.profiler.measure through
   sonic_jax.bench.timing, medians after warm-up, random data; each row's ``timer`` says
   "cupti" or "wall", the fallback) of several kernel configs, kernel-only (pre-gathered rows) and
   with the XLA gather, against an XLA dense matmul of the same total shape, and jax's own
   transposed_ragged_dot_mgpu for the weight gradients.
Writes pallas-backward-h200-<date>.json/.md into --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from sonic_jax.bench.timing import compile_and_time  # noqa: E402
from sonic_jax.pallas.dh import DhConfig, dh, dh_config_for  # noqa: E402
from sonic_jax.pallas.wgrad import (WgradConfig, dw1, dw2, grouped_outer,  # noqa: E402
                                    wgrad_config_for)
from sonic_jax.routing import route_logits  # noqa: E402
from sonic_jax.xla_backend import XlaKernels, dswiglu  # noqa: E402

BF = jnp.bfloat16
LOG: list[str] = []
INTERPRET = False  # --interpret: CPU smoke run of this script in the Mosaic GPU interpreter


def log(msg: str) -> None:
  print(msg, flush=True)
  LOG.append(msg)


def rel(a, b) -> float:
  a = np.asarray(a, np.float32)
  b = np.asarray(b, np.float32)
  if not np.all(np.isfinite(a)):
    return float("inf")
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def time_ms(f, *args, iters: int) -> tuple[float, str | None]:
  """(median GPU time of f(*args) in ms, timer): CUPTI, or the wall clock where CUPTI fails.

  Compile, a first call and one warm-up call; --interpret runs once and times nothing (nan,
  None).
  """
  t = compile_and_time(f, args, iters=0 if INTERPRET else iters, warmup=1).timing
  if t is None:
    return float("nan"), None
  if t.note:
    log(f"  ({t.note})")
  return t.median_ms, t.timer


def make_inputs(t, d, n, e, k, seed=0, empty_expert=False):
  keys = jax.random.split(jax.random.key(seed), 8)
  logits = jax.random.normal(keys[0], (t, e))
  if empty_expert:
    logits = logits.at[:, 0].set(-1e9)
  plan = route_logits(logits, top_k=k)
  p = plan.capacity
  return dict(
      plan=plan,
      x=jax.random.normal(keys[1], (t, d), BF),
      dout=jax.random.normal(keys[2], (t, d), BF),
      w2=(jax.random.normal(keys[3], (e, n, d)) / np.sqrt(d)).astype(BF),
      h=jax.random.normal(keys[4], (p, 2 * n), BF),
      dh=jax.random.normal(keys[5], (p, 2 * n), BF),
      a_prime=jax.random.normal(keys[6], (p, n), BF),
  )


def correctness_medium(results):
  log("== correctness vs xla backend: T=4096 d=1024 n=512 E=12 (expert 0 empty) K=4 ==")
  a = make_inputs(4096, 1024, 512, 12, 4, empty_expert=True)
  plan = a["plan"]
  s = plan.grouped_scores()
  xla = XlaKernels()
  f_dh = jax.jit(lambda *args: dh(*args, interpret=INTERPRET))
  got = f_dh(a["dout"], a["w2"], a["h"], s, plan)
  want = xla.dh(a["dout"], a["w2"], a["h"], s, plan)
  again = f_dh(a["dout"], a["w2"], a["h"], s, plan)
  f_w = jax.jit(lambda x, dout, dh_, ap, plan: (dw1(x, dh_, plan, interpret=INTERPRET),
                                                          dw2(dout, ap, plan, interpret=INTERPRET)))
  g1, g2 = f_w(a["x"], a["dout"], a["dh"], a["a_prime"], plan)
  h1, h2 = f_w(a["x"], a["dout"], a["dh"], a["a_prime"], plan)
  r = {
      "dS": rel(got[2], want[2]), "dH": rel(got[0], want[0]), "A_prime": rel(got[1], want[1]),
      "dW1": rel(g1, xla.dw1(a["x"], a["dh"], plan)),
      "dW2": rel(g2, xla.dw2(a["dout"], a["a_prime"], plan)),
      "dW_empty_expert_zero": bool(np.all(np.asarray(g1[0]) == 0) and
                                   np.all(np.asarray(g2[0]) == 0)),
      "deterministic": bool(all(np.array_equal(np.asarray(u), np.asarray(v))
                                for u, v in zip(list(got) + [g1, g2], list(again) + [h1, h2]))),
  }
  for kk, v in r.items():
    log(f"  {kk}: {v}")
  results["correctness_medium"] = r


def spot_check_big(a, g, got_dh, got_w1, got_w2, results):
  """float32 reference for three experts (first, middle, last) at the benchmark shape."""
  plan = a["plan"]
  offs = np.asarray(plan.group_offsets)
  e_count = plan.num_experts
  s = np.asarray(plan.grouped_scores())
  out = {}
  for e in (0, e_count // 2, e_count - 1):
    o, f = int(offs[e]), int(offs[e + 1] - offs[e])
    if f == 0:
      continue
    dg = g["dout"][o:o + f].astype(jnp.float32)
    da = dg @ a["w2"][e].astype(jnp.float32).T
    dh_u, a_ = dswiglu(da, a["h"][o:o + f].astype(jnp.float32))
    ds = jnp.sum(da * a_, axis=-1)
    sc = jnp.asarray(s[o:o + f])[:, None]
    out[f"expert{e}"] = {
        "rows": f,
        "dS": rel(got_dh[2][o:o + f], ds),
        "dH": rel(got_dh[0][o:o + f], sc * dh_u),
        "A_prime": rel(got_dh[1][o:o + f], sc * a_),
        "dW1": rel(got_w1[e], g["x"][o:o + f].astype(jnp.float32).T
                   @ a["dh"][o:o + f].astype(jnp.float32)),
        "dW2": rel(got_w2[e], a["a_prime"][o:o + f].astype(jnp.float32).T @ dg),
    }
    log(f"  spot check expert {e}: {out[f'expert{e}']}")
  results["spot_check_big"] = out


def bench(shape, iters, results, only="all"):
  t, d, n, e, k = shape
  log(f"== benchmark shape T={t} d={d} n={n} E={e} K={k} (bf16) ==")
  a = make_inputs(t, d, n, e, k, seed=1)
  plan = a["plan"]
  p = plan.capacity
  s = plan.grouped_scores()
  gather = jax.jit(lambda v, idx: v[idx])
  g = {"dout": gather(a["dout"], plan.gather_idx), "x": gather(a["x"], plan.gather_idx)}
  sizes = np.asarray(plan.group_sizes)
  log(f"  group sizes min/median/max: {sizes.min()}/{int(np.median(sizes))}/{sizes.max()}")
  rows = []

  def record(name, kind, timed, flops, note=""):
    ms, timer = timed
    tf = flops / (ms * 1e-3) / 1e12 if ms else float("nan")
    rows.append(dict(name=name, kind=kind, ms=ms, tflops=tf, note=note, timer=timer))
    log(f"  {name:<44} {ms:8.3f} ms {tf:7.1f} TF/s {note}")

  f_dh_flops = 2.0 * p * d * n
  f_w1_flops = 2.0 * p * d * 2 * n
  f_w2_flops = 2.0 * p * n * d

  # XLA dense baselines of the same total shapes.
  def try_(fn):
    try:
      return fn()
    except Exception as ex:  # noqa: BLE001
      log(f"  FAILED: {type(ex).__name__}: {str(ex)[:2000]}")
      traceback.print_exc()
      return None

  dense_dh = jax.jit(lambda u, w: jnp.dot(u, w, preferred_element_type=jnp.float32).astype(BF))
  w_dense = a["w2"][0].T  # (d, n)
  try_(lambda: record("xla dense (P,d)x(d,n) [dh shape]", "baseline",
                      time_ms(dense_dh, g["dout"], w_dense, iters=iters), f_dh_flops))
  dense_outer = jax.jit(lambda u, v: jax.lax.dot_general(
      u, v, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(BF))
  try_(lambda: record("xla dense (P,d)^T(P,2n) [dw1 shape]", "baseline",
                      time_ms(dense_outer, g["x"], a["dh"], iters=iters), f_w1_flops))
  try_(lambda: record("xla dense (P,n)^T(P,d) [dw2 shape]", "baseline",
                      time_ms(dense_outer, a["a_prime"], g["dout"], iters=iters), f_w2_flops))
  try_(lambda: record("xla gather dout[gather_idx] (P,d)", "gather",
                      time_ms(gather, a["dout"], plan.gather_idx, iters=iters), 0.0))

  dh_cfgs = {} if only == "wgrad" else {
      "dh 128x128x64 s4 gbn8 epi64": DhConfig(),
      "dh 128x128x64 s3 gbn4 epi128": DhConfig(max_concurrent_steps=3, grid_block_n=4, epi_n=128),
  }
  best_dh = None
  for name, cfg in dh_cfgs.items():
    fk = jax.jit(lambda dout, w2, h, s, plan, dg, cfg=cfg: dh(dout, w2, h, s, plan, config=cfg,
                                                              dout_gathered=dg,
                                                              interpret=INTERPRET))
    timed = try_(lambda: time_ms(fk, a["dout"], a["w2"], a["h"], s, plan, g["dout"],
                                 iters=iters))
    if timed is not None:
      record(name + " (kernel only)", "dh", timed, f_dh_flops)
      if best_dh is None or timed[0] < best_dh[1]:
        best_dh = (name, timed[0], cfg)
  if best_dh is not None:
    cfg = best_dh[2]
    fg = jax.jit(lambda dout, w2, h, s, plan: dh(dout, w2, h, s, plan, config=cfg,
                                                         interpret=INTERPRET))
    try_(lambda: record(best_dh[0] + " (+XLA gather)", "dh",
                        time_ms(fg, a["dout"], a["w2"], a["h"], s, plan, iters=iters),
                        f_dh_flops))

  # dO rows gathered inside the kernel (DhConfig(gather="fused"), opt-in): raw dout in, so the
  # time includes the gather, against the "(+XLA gather)" row above.
  fused_cfgs = {} if only == "wgrad" else {
      "dh fused gather (dh_config_for)": dh_config_for(a["dout"].shape[1], a["h"].shape[1] // 2,
                                                       gather="fused"),
      "dh fused gather 128x128x32 s6": DhConfig(block_k=32, max_concurrent_steps=6,
                                                gather="fused"),
  }
  for name, cfg in fused_cfgs.items():
    ff = jax.jit(lambda dout, w2, h, s, plan, cfg=cfg: dh(dout, w2, h, s, plan, config=cfg,
                                                          interpret=INTERPRET))
    try_(lambda: record(name, "dh", time_ms(ff, a["dout"], a["w2"], a["h"], s, plan,
                                             iters=iters), f_dh_flops))

  wg_cfgs = {} if only == "dh" else {
      "wgrad 128x128x64 s4 gbn1": WgradConfig(),
      "wgrad 128x128x64 s5 gbn4": WgradConfig(max_concurrent_steps=5, grid_block_n=4),
  }
  best_wg = None
  for name, cfg in wg_cfgs.items():
    fk = jax.jit(lambda u, v, plan, cfg=cfg: grouped_outer(u, v, plan, config=cfg,
                                                                  interpret=INTERPRET))
    timed1 = try_(lambda: time_ms(fk, g["x"], a["dh"], plan, iters=iters))
    if timed1 is not None:
      record(name + " dw1 (kernel only)", "dw1", timed1, f_w1_flops)
    timed2 = try_(lambda: time_ms(fk, a["a_prime"], g["dout"], plan, iters=iters))
    if timed2 is not None:
      record(name + " dw2 (kernel only)", "dw2", timed2, f_w2_flops)
    if timed1 is not None and (best_wg is None or timed1[0] < best_wg[1]):
      best_wg = (name, timed1[0], cfg)
  if best_wg is not None:
    cfg = best_wg[2]
    f1 = jax.jit(lambda x, dh_, plan: dw1(x, dh_, plan, config=cfg, interpret=INTERPRET))
    f2 = jax.jit(lambda dout, ap, plan: dw2(dout, ap, plan, config=cfg, interpret=INTERPRET))
    try_(lambda: record(best_wg[0] + " dw1 (+XLA gather)", "dw1",
                        time_ms(f1, a["x"], a["dh"], plan, iters=iters), f_w1_flops))
    try_(lambda: record(best_wg[0] + " dw2 (+XLA gather)", "dw2",
                        time_ms(f2, a["dout"], a["a_prime"], plan, iters=iters), f_w2_flops))

  # Two consumer warpgroups on XLA-gathered operands (WgradConfig(num_compute_wgs=2), opt-in):
  # the ring kernel of the fused gather with the gathered side by TMA, 128x256 (dW1) / 256x128
  # (dW2) tiles; against the one-warpgroup kernel-only rows above.
  if only != "dh" and (2 * n) % 256 == 0 and n % 256 == 0 and d % 128 == 0:
    ring1 = WgradConfig(block_m=128, block_n=256, max_concurrent_steps=3, grid_block_n=4,
                        num_compute_wgs=2)
    ring2 = WgradConfig(block_m=256, block_n=128, max_concurrent_steps=3, grid_block_n=4,
                        num_compute_wgs=2)
    r1 = jax.jit(lambda u, v, plan: grouped_outer(u, v, plan, config=ring1, shared="lhs",
                                                  interpret=INTERPRET))
    r2 = jax.jit(lambda u, v, plan: grouped_outer(u, v, plan, config=ring2, shared="rhs",
                                                  interpret=INTERPRET))
    try_(lambda: record("wgrad ring 2wg 128x256 s3 dw1 (kernel only)", "dw1",
                        time_ms(r1, g["x"], a["dh"], plan, iters=iters), f_w1_flops))
    try_(lambda: record("wgrad ring 2wg 256x128 s3 dw2 (kernel only)", "dw2",
                        time_ms(r2, a["a_prime"], g["dout"], plan, iters=iters), f_w2_flops))

  # x / dO rows gathered inside the kernel (WgradConfig(gather="fused"), opt-in): raw x / dout
  # in, so the time includes the gather, against the "(+XLA gather)" rows above.
  wg_fused = {} if only == "dh" else {
      "wgrad fused gather (wgrad_config_for)": (wgrad_config_for(d, 2 * n, gather="fused"),
                                                wgrad_config_for(n, d, gather="fused")),
      "wgrad fused gather 2wg 128x256 / 256x128 s3": (
          wgrad_config_for(d, 2 * n, gather="fused", gathered="lhs"),
          wgrad_config_for(n, d, gather="fused", gathered="rhs")),
      "wgrad fused gather 128x128x64 s4 gbn1": (WgradConfig(max_concurrent_steps=4,
                                                            gather="fused"),) * 2,
  }
  for name, (c1, c2) in wg_fused.items():
    f1 = jax.jit(lambda x, dh_, plan, c=c1: dw1(x, dh_, plan, config=c, interpret=INTERPRET))
    f2 = jax.jit(lambda dout, ap, plan, c=c2: dw2(dout, ap, plan, config=c, interpret=INTERPRET))
    try_(lambda: record(name + " dw1", "dw1", time_ms(f1, a["x"], a["dh"], plan, iters=iters),
                        f_w1_flops))
    try_(lambda: record(name + " dw2", "dw2",
                        time_ms(f2, a["dout"], a["a_prime"], plan, iters=iters), f_w2_flops))

  # jax's own varlen-K kernel on the same operands, for reference.
  def jax_trd():
    from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as trd
    f = jax.jit(lambda u, v, gs: trd.transposed_ragged_dot(
        u, v, group_sizes=gs, block_m=128, block_n=128, block_k=64, max_concurrent_steps=4,
        grid_block_n=1))
    record("jax transposed_ragged_dot_mgpu dw1 shape", "reference",
           time_ms(f, g["x"], a["dh"], plan.group_sizes, iters=iters), f_w1_flops)
  if not INTERPRET and only != "dh":
    try_(jax_trd)

  # Spot check the kernels' results at this shape against float32 per-expert references.
  def check():
    cfg_dh = best_dh[2] if best_dh else DhConfig()
    cfg_wg = best_wg[2] if best_wg else WgradConfig()
    got_dh = jax.jit(lambda *args: dh(*args, config=cfg_dh, interpret=INTERPRET))(a["dout"], a["w2"], a["h"], s, plan)
    got_w1 = jax.jit(lambda x, dh_, plan: dw1(x, dh_, plan, config=cfg_wg,
                                                           interpret=INTERPRET))(a["x"], a["dh"], plan)
    got_w2 = jax.jit(lambda dout, ap, plan: dw2(dout, ap, plan, config=cfg_wg,
                                                               interpret=INTERPRET))(
        a["dout"], a["a_prime"], plan)
    spot_check_big(a, g, got_dh, got_w1, got_w2, results)
  try_(check)
  results["bench"] = rows
  results["best"] = {"dh": best_dh[0] if best_dh else None,
                     "wgrad": best_wg[0] if best_wg else None}


def write(results, out_dir, argv, suffix=""):
  date = datetime.date.today().isoformat()
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, f"pallas-backward{suffix}-h200-{date}")
  with open(stem + ".json", "w") as f:
    json.dump(results, f, indent=1, default=str)
  lines = [f"# Pallas backward kernels on {results['device']}, {date}", "",
           f"jax {jax.__version__}; command: `{' '.join(argv)}`", "",
           "Timings: CUPTI (jax.experimental.mosaic.gpu.profiler.measure), median of "
           f"{results['iters']} runs after warm-up, random bf16 data. Timers (JSON `timer`): "
           f"{', '.join(sorted({str(r.get('timer')) for r in results.get('bench', [])}))} "
           "(wall: the host clock where CUPTI failed; None: not timed).", "",
           "## Correctness (medium shape vs xla backend)", "",
           "```", json.dumps(results.get("correctness_medium"), indent=1), "```", "",
           "## Spot check at the benchmark shape (float32 per-expert reference)", "",
           "```", json.dumps(results.get("spot_check_big"), indent=1), "```", "",
           f"## Timings, shape {results['shape']}", "",
           "| kernel | kind | ms | TFLOP/s |", "| --- | --- | --- | --- |"]
  for r in results.get("bench", []):
    lines.append(f"| {r['name']} | {r['kind']} | {r['ms']:.3f} | {r['tflops']:.1f} |")
  with open(stem + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  log(f"wrote {stem}.json/.md")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  ap.add_argument("--shape", default="32768,4096,1024,128,8")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--skip-correctness", action="store_true")
  ap.add_argument("--only", choices=("all", "dh", "wgrad"), default="all",
                  help="time one kernel family (a kernel fault poisons the process's CUDA context)")
  ap.add_argument("--interpret", action="store_true",
                  help="CPU smoke run in the GPU interpreter (tiny --shape only, no timings)")
  args = ap.parse_args()
  global INTERPRET
  INTERPRET = args.interpret
  shape = tuple(int(v) for v in args.shape.split(","))
  dev = jax.devices()[0]
  results = {"device": f"{dev.device_kind} ({dev.platform})", "jax": jax.__version__,
             "shape": dict(zip("T d n E K".split(), shape)), "iters": args.iters,
             "configs": {"DhConfig": dataclasses.asdict(DhConfig()),
                         "WgradConfig": dataclasses.asdict(WgradConfig())}}
  try:
    if not args.skip_correctness and not args.interpret:
      correctness_medium(results)
  except Exception as ex:  # noqa: BLE001
    log(f"correctness FAILED: {type(ex).__name__}: {str(ex)[:3000]}")
    traceback.print_exc()
  try:
    bench(shape, args.iters, results, args.only)
  finally:
    results["log"] = LOG
    write(results, args.out, sys.argv, "" if args.only == "all" else "-" + args.only)


if __name__ == "__main__":
  main()
