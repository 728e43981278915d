"""Config sweep of the Pallas kernels (up_proj, down_proj, dh, dw1, dw2) on one GPU.

  python benchmarks/pallas_sweep.py --out-dir DIR [--budget-s 120] [--iters 10] [--interpret]

Times each grouped GEMM under several tilings (block sizes, stages, 1 vs 2 consumer warpgroups,
tile order width, epilogue variant) against an XLA dense matmul of the same total shape, at the
paper's configs (sonicmoe-spec.md §7.2). Kernels run on pre-gathered operands ("kernel only");
the heuristic config of up_proj is also timed with the XLA gather of x included. Every variant is
checked against a float32 reference on the rows of three experts (relative Frobenius error).
Jobs run most important first and stop when ``--budget-s`` is spent; results are written after
every job to DIR/pallas-sweep.json and a table is printed last. GPU-side timing: CUPTI
(``jax.experimental.mosaic.gpu.profiler.measure`` through ``sonic_jax.bench.timing``; each
row's ``timer`` says "cupti" or "wall", the fallback), median of ``--iters`` calls after a
warm-up, random bf16 data. FLOPs as the paper counts them: up 4·TK·d·n, down / dh / dw2 2·TK·n·d,
dw1 4·TK·d·n. ``--interpret`` runs a few jobs at a tiny shape in the Mosaic GPU interpreter (a
CPU smoke test of this script).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sonic_jax.bench.timing import compile_and_time, on_gpu  # noqa: E402
from sonic_jax.pallas import configs as cfgs  # noqa: E402
from sonic_jax.pallas.dh import DhConfig, dh  # noqa: E402
from sonic_jax.pallas.grouped_gemm import grouped_gemm  # noqa: E402
from sonic_jax.pallas.wgrad import WgradConfig, grouped_outer  # noqa: E402
from sonic_jax.routing import route_logits  # noqa: E402
from sonic_jax.xla_backend import dswiglu  # noqa: E402

BF = jnp.bfloat16
SHAPES = {  # name: (T, d, n, E, K), sonicmoe-spec.md §7.2
    "7B-256": (24576, 1536, 256, 128, 8), "7B-1024": (24576, 1536, 1024, 32, 2),
    "30B-512": (32768, 4096, 512, 128, 8), "120B-1024": (32768, 4096, 1024, 128, 8),
    "120B-2048": (32768, 4096, 2048, 64, 4),
    "tiny": (96, 128, 128, 5, 2),  # --interpret
}


def rel(a, b) -> float:
  a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
  if not np.isfinite(a).all():
    return float("inf")
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Sweep:

  def __init__(self, args):
    self.args = args
    self.t0 = time.monotonic()
    self.rows: list[dict] = []
    self.data: dict = {}
    self.dense: dict = {}
    self.interpret = args.interpret
    self.logf = open(os.path.join(args.out_dir, "pallas-sweep.log"), "w")

  def log(self, msg):
    print(msg, flush=True)
    self.logf.write(msg + "\n")
    self.logf.flush()

  def left(self) -> float:
    return self.args.budget_s - (time.monotonic() - self.t0)

  def time_ms(self, f, *args):
    """(first call's outputs, median ms, first-call s incl. compile, timer); no timing (nan,
    timer None) in the interpreter or off a GPU."""
    timed = not self.interpret and on_gpu()
    m = compile_and_time(f, args, iters=self.args.iters if timed else 0, warmup=1)
    if m.timing is None:
      return m.out, float("nan"), m.first_call_s, None
    if m.timing.note:
      self.log(f"  ({m.timing.note})")
    return m.out, m.timing.median_ms, m.first_call_s, m.timing.timer

  # -------------------------------------------------------------------------- data per shape
  def get(self, shape):
    if shape in self.data:
      return self.data[shape]
    t, d, n, e, k = SHAPES[shape]
    ks = jax.random.split(jax.random.key(0), 8)
    logits = jax.random.normal(ks[0], (t, e), jnp.float32)
    plan = jax.jit(lambda lg: route_logits(lg, top_k=k))(logits)
    p = plan.capacity
    x = jax.random.normal(ks[1], (t, d), jnp.float32).astype(BF)
    dout = jax.random.normal(ks[2], (t, d), jnp.float32).astype(BF)
    g = dict(
        plan=plan, x=x, dout=dout,
        xg=jax.jit(lambda v, i: v[i])(x, plan.gather_idx),
        doutg=jax.jit(lambda v, i: v[i])(dout, plan.gather_idx),
        w1=(jax.random.normal(ks[3], (e, d, 2 * n), jnp.float32) / np.sqrt(d)).astype(BF),
        w2=(jax.random.normal(ks[4], (e, n, d), jnp.float32) / np.sqrt(n)).astype(BF),
        a=jax.random.normal(ks[5], (p, n), jnp.float32).astype(BF),
        h=jax.random.normal(ks[6], (p, 2 * n), jnp.float32).astype(BF),
        dh=jax.random.normal(ks[7], (p, 2 * n), jnp.float32).astype(BF),
    )
    sizes = np.asarray(plan.group_sizes)
    g["check"] = sorted({int(np.argmax(sizes > 0)), e // 2, e - 1})
    g["offs"] = np.asarray(plan.group_offsets)
    self.data[shape] = g
    return g

  def rows_of(self, g, e):
    return int(g["offs"][e]), int(g["offs"][e + 1])

  # ------------------------------------------------------------------------------ recording
  def record(self, shape, kernel, variant, ms, flops, err=None, first_s=None, note="",
             timer=None):
    tf = flops / (ms * 1e-3) / 1e12 if ms == ms and ms else float("nan")
    dense = self.dense.get((shape, kernel))
    vs = tf / dense if dense else float("nan")
    r = dict(shape=shape, dims=SHAPES[shape], kernel=kernel, variant=variant, ms=ms, tflops=tf,
             vs_dense=vs, rel_err=err, first_call_s=first_s, note=note, timer=timer)
    self.rows.append(r)
    self.log(f"  {shape:<9} {kernel:<10} {variant:<44} {ms:8.3f} ms {tf:6.1f} TF/s "
             f"x{vs:.2f}  err={err if err is None else f'{err:.2e}'} {note}")
    self.write()

  def write(self):
    dev = jax.devices()[0]
    with open(os.path.join(self.args.out_dir, "pallas-sweep.json"), "w") as f:
      json.dump(dict(gpu=getattr(dev, "device_kind", dev.platform), jax=jax.__version__,
                     python=platform.python_version(), date=datetime.date.today().isoformat(),
                     command="python " + " ".join(sys.argv), iters=self.args.iters,
                     rows=self.rows), f, indent=1, default=str)

  def guarded(self, name, fn):
    if self.left() <= 0:
      return
    try:
      fn()
    except Exception as ex:  # noqa: BLE001 - record and go on with the other jobs
      self.log(f"  {name}: FAILED {type(ex).__name__}: {str(ex)[:400]}")
      self.logf.write(traceback.format_exc()[-4000:] + "\n")
      self.rows.append(dict(kernel=name, error=f"{type(ex).__name__}: {str(ex)[:1000]}"))
      self.write()

  # ---------------------------------------------------------------------------------- jobs
  def dense_jobs(self, shape, kinds):
    t, d, n, e, k = SHAPES[shape]
    tk = t * k

    def run():
      g = self.get(shape)
      # bf16 outputs like the kernels' (an fp32 output + convert pass made the session-2 runs'
      # dense baselines 7-27 % slower than cuBLAS's bf16-output GEMM).
      mm = lambda a, b: a @ b
      outer = lambda a, b: jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())))
      todo = {
          "up": (mm, (g["xg"], g["w1"][0]), 4 * tk * d * n),
          "down": (mm, (g["a"], g["w2"][0]), 2 * tk * n * d),
          "dh": (mm, (g["doutg"], g["w2"][0].T), 2 * tk * n * d),
          "dw1": (outer, (g["xg"], g["dh"]), 4 * tk * d * n),
          "dw2": (outer, (g["a"], g["doutg"]), 2 * tk * n * d),
      }
      for kind in kinds:
        f, args, flops = todo[kind]
        _, ms, _, timer = self.time_ms(f, *args)
        self.dense[(shape, kind)] = flops / (ms * 1e-3) / 1e12 if ms == ms else None
        self.record(shape, kind, "xla dense (same total shape)", ms, flops, timer=timer)
      if "up" in kinds:
        _, ms, _, timer = self.time_ms(lambda v, i: v[i], g["x"], g["plan"].gather_idx)
        self.record(shape, "gather", "xla x[gather_idx]", ms, 0.0, timer=timer)
    self.guarded(f"dense {shape}", run)

  def up(self, shape, variant, cfg: cfgs.GemmConfig, with_gather=False):
    t, d, n, e, k = SHAPES[shape]

    def run():
      g = self.get(shape)
      plan = g["plan"]
      c = dataclasses.replace(cfg, num_sms=2) if self.interpret else cfg
      gs, go, rows = plan.group_sizes, plan.group_offsets, plan.capacity
      if with_gather:
        f = lambda x, w: grouped_gemm(x, w, gs, go, num_rows=rows, gather_idx=plan.gather_idx,
                                      epilogue="swiglu", config=c, interpret=self.interpret)
        args = (g["x"], g["w1"])
      else:
        f = lambda xg, w: grouped_gemm(xg, w, gs, go, num_rows=rows, epilogue="swiglu",
                                       config=c, interpret=self.interpret)
        args = (g["xg"], g["w1"])
      (h, a), ms, first, timer = self.time_ms(f, *args)
      num = den = 0.0
      for ex in g["check"]:
        lo, hi = self.rows_of(g, ex)
        ref = jnp.dot(g["xg"][lo:hi].astype(jnp.float32), g["w1"][ex].astype(jnp.float32))
        a_ref = jax.nn.silu(ref[:, :n]) * ref[:, n:]
        for got, want in ((h[lo:hi], ref), (a[lo:hi], a_ref)):
          num += rel(got, want) ** 2 * float(jnp.sum(want * want))
          den += float(jnp.sum(want * want))
      err = float(np.sqrt(num / max(den, 1e-30)))
      self.record(shape, "up", variant + (" +xla gather" if with_gather else ""), ms,
                  4 * t * k * d * n, err, first, timer=timer)
    self.guarded(f"up {shape} {variant}", run)

  def down(self, shape, variant, cfg: cfgs.GemmConfig):
    t, d, n, e, k = SHAPES[shape]

    def run():
      g = self.get(shape)
      plan = g["plan"]
      c = dataclasses.replace(cfg, num_sms=2) if self.interpret else cfg
      f = lambda a, w: grouped_gemm(a, w, plan.group_sizes, plan.group_offsets,
                                    num_rows=plan.capacity, config=c, interpret=self.interpret)
      y, ms, first, timer = self.time_ms(f, g["a"], g["w2"])
      errs = []
      for ex in g["check"]:
        lo, hi = self.rows_of(g, ex)
        ref = jnp.dot(g["a"][lo:hi].astype(jnp.float32), g["w2"][ex].astype(jnp.float32))
        errs.append(rel(y[lo:hi], ref))
      self.record(shape, "down", variant, ms, 2 * t * k * n * d, max(errs), first, timer=timer)
    self.guarded(f"down {shape} {variant}", run)

  def dh(self, shape, variant, cfg: DhConfig):
    t, d, n, e, k = SHAPES[shape]

    def run():
      g = self.get(shape)
      plan = g["plan"]
      c = dataclasses.replace(cfg, num_sms=2) if self.interpret else cfg
      s = plan.grouped_scores()
      f = lambda dout, w2, h, s, dg: dh(dout, w2, h, s, plan, config=c,
                                        interpret=self.interpret, dout_gathered=dg)
      (dh_, ap, ds), ms, first, timer = self.time_ms(f, g["dout"], g["w2"], g["h"], s,
                                                     g["doutg"])
      errs = []
      sg = np.asarray(s)
      for ex in g["check"]:
        lo, hi = self.rows_of(g, ex)
        da = g["doutg"][lo:hi].astype(jnp.float32) @ g["w2"][ex].astype(jnp.float32).T
        dh_u, a_ = dswiglu(da, g["h"][lo:hi].astype(jnp.float32))
        sc = jnp.asarray(sg[lo:hi])[:, None]
        errs += [rel(ds[lo:hi], jnp.sum(da * a_, axis=-1)), rel(dh_[lo:hi], sc * dh_u),
                 rel(ap[lo:hi], sc * a_)]
      self.record(shape, "dh", variant, ms, 2 * t * k * n * d, max(errs), first, timer=timer)
    self.guarded(f"dh {shape} {variant}", run)

  def wgrad(self, shape, which, variant, cfg: WgradConfig):
    t, d, n, e, k = SHAPES[shape]

    def run():
      g = self.get(shape)
      plan = g["plan"]
      c = dataclasses.replace(cfg, num_sms=2) if self.interpret else cfg
      lhs, rhs = (g["xg"], g["dh"]) if which == "dw1" else (g["a"], g["doutg"])
      f = lambda u, v: grouped_outer(u, v, plan, config=c, interpret=self.interpret)
      out, ms, first, timer = self.time_ms(f, lhs, rhs)
      errs = []
      for ex in g["check"]:
        lo, hi = self.rows_of(g, ex)
        errs.append(rel(out[ex], lhs[lo:hi].astype(jnp.float32).T
                        @ rhs[lo:hi].astype(jnp.float32)))
      flops = (4 if which == "dw1" else 2) * t * k * d * n
      self.record(shape, which, variant, ms, flops, max(errs), first, timer=timer)
    self.guarded(f"{which} {shape} {variant}", run)


def gemm_variants():
  G = cfgs.GemmConfig
  up = {  # SwiGLU up-projection
      "ws2 bn64 s3 w8": G(block_n=64, max_concurrent_steps=3, num_compute_wgs=2),
      "ws2 bn64 s3 w8 swz": G(block_n=64, max_concurrent_steps=3, num_compute_wgs=2,
                              epilogue_swizzle=True),
      "ws2 bn64 s3 w4": G(block_n=64, max_concurrent_steps=3, num_compute_wgs=2,
                          grid_tile_width=4),
      "ws2 bn64 s3 w16": G(block_n=64, max_concurrent_steps=3, num_compute_wgs=2,
                           grid_tile_width=16),
      "ws2 bn64 bk32 s6 w8": G(block_n=64, block_k=32, max_concurrent_steps=6,
                               num_compute_wgs=2),
      "1wg bn64 s4 w8": G(block_n=64, max_concurrent_steps=4),
      "1wg bn64 s4 w8 swz": G(block_n=64, max_concurrent_steps=4, epilogue_swizzle=True),
      "ws2 bn64 s3 w1": G(block_n=64, max_concurrent_steps=3, num_compute_wgs=2,
                          grid_tile_width=1),
  }
  down = {  # plain GEMM
      "ws2 bn128 s3 w8": G(block_n=128, max_concurrent_steps=3, num_compute_wgs=2),
      "ws2 bn128 s3 w8 swz": G(block_n=128, max_concurrent_steps=3, num_compute_wgs=2,
                               epilogue_swizzle=True),
      "ws2 bn128 s3 w4": G(block_n=128, max_concurrent_steps=3, num_compute_wgs=2,
                           grid_tile_width=4),
      "ws2 bn128 s3 w16": G(block_n=128, max_concurrent_steps=3, num_compute_wgs=2,
                            grid_tile_width=16),
      "ws2 bn128 bk32 s6 w8": G(block_n=128, block_k=32, max_concurrent_steps=6,
                                num_compute_wgs=2),
      "ws2 bn64 s4 w8": G(block_n=64, max_concurrent_steps=4, num_compute_wgs=2),
      "1wg bn128 s5 w8": G(block_n=128, max_concurrent_steps=5),
      "1wg bn128 s5 w8 swz": G(block_n=128, max_concurrent_steps=5, epilogue_swizzle=True),
      "1wg bm64 bn256 s4 w8": G(block_m=64, block_n=256, max_concurrent_steps=4),
  }
  return up, down


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
  ap.add_argument("--budget-s", type=float, default=120.0)
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--interpret", action="store_true")
  ap.add_argument("--phase", type=int, default=1,
                  help="1: the broad sweep; 2: old vs new default configs (the confirmation "
                       "run); 3: what session 2 did not measure (dh prefetch, new defaults at "
                       "other shapes)")
  args = ap.parse_args()
  os.makedirs(args.out_dir, exist_ok=True)
  sw = Sweep(args)
  dev = jax.devices()[0]
  sw.log(f"device {getattr(dev, 'device_kind', dev.platform)}, jax {jax.__version__}")
  up, down = gemm_variants()
  if args.interpret:
    s = "tiny"
    sw.dense_jobs(s, ["up", "down", "dh", "dw1", "dw2"])
    for name in ("ws2 bn64 s3 w8 swz", "1wg bn64 s4 w8 swz"):
      sw.up(s, name, up[name])
    sw.up(s, "ws2 bn64 s3 w8", up["ws2 bn64 s3 w8"], with_gather=True)
    for name in ("ws2 bn128 s3 w8 swz", "1wg bn128 s5 w8 swz"):
      sw.down(s, name, dataclasses.replace(down[name], block_n=64 if "ws2" in name else 128))
    sw.dh(s, "default", DhConfig(block_n=64, epi_n=64))
    sw.wgrad(s, "dw1", "default", WgradConfig())
    sw.wgrad(s, "dw2", "default", WgradConfig())
  elif args.phase == 2:
    fwd, bwd = "30B-512", "120B-1024"
    G, W = cfgs.GemmConfig, WgradConfig
    new_up = {"new default ws2 bn64 s3 w8 swz": up["ws2 bn64 s3 w8 swz"],
              "ws2 bn64 bk32 s6 w8 swz": G(block_n=64, block_k=32, max_concurrent_steps=6,
                                           num_compute_wgs=2, epilogue_swizzle=True)}
    new_down = {"new default ws2 bn128 bk32 s6 w8": down["ws2 bn128 bk32 s6 w8"],
                "ws2 bn128 bk32 s6 w16": G(block_n=128, block_k=32, max_concurrent_steps=6,
                                           num_compute_wgs=2, grid_tile_width=16)}
    for s in (fwd, "7B-1024"):
      sw.dense_jobs(s, ["up", "down"])
      sw.up(s, "old default ws2 bn64 s3 w8", up["ws2 bn64 s3 w8"])
      for name, c in new_up.items():
        sw.up(s, name, c)
      sw.down(s, "old default ws2 bn128 s3 w8", down["ws2 bn128 s3 w8"])
      for name, c in new_down.items():
        sw.down(s, name, c)
    sw.dense_jobs(bwd, ["dh", "dw1", "dw2"])
    sw.dh(bwd, "128x128x64 s4 gbn8 epi64, H prefetched", DhConfig())
    sw.wgrad(bwd, "dw1", "new default 128x128x64 s5 gbn4", W(max_concurrent_steps=5,
                                                                grid_block_n=4))
    sw.wgrad(bwd, "dw2", "new default 128x128x64 s5 gbn4", W(max_concurrent_steps=5,
                                                                grid_block_n=4))
    sw.up(fwd, "new default ws2 bn64 s3 w8 swz", up["ws2 bn64 s3 w8 swz"], with_gather=True)
    for s in ("120B-2048", "7B-256"):
      sw.dense_jobs(s, ["up", "down"])
      sw.up(s, "new default ws2 bn64 s3 w8 swz", up["ws2 bn64 s3 w8 swz"])
      sw.down(s, "new default ws2 bn128 bk32 s6 w8", down["ws2 bn128 bk32 s6 w8"])
  elif args.phase == 3:
    # What session 2's device time did not reach: the H-prefetching dh, the new defaults at
    # other shapes, and up_proj with the XLA gather, against bf16-output dense baselines.
    fwd, bwd = "30B-512", "120B-1024"
    sw.dense_jobs(bwd, ["dh", "dw1", "dw2"])
    sw.dh(bwd, "128x128x64 s4 gbn8 epi64, H prefetched", DhConfig())
    sw.wgrad(bwd, "dw2", "new default 128x128x64 s5 gbn4", WgradConfig(max_concurrent_steps=5,
                                                                         grid_block_n=4))
    new_up, new_down = cfgs.swiglu_gemm_config(4096, 512), cfgs.plain_gemm_config(512, 4096)
    sw.dense_jobs(fwd, ["up", "down"])
    sw.up(fwd, "new default", new_up)
    sw.up(fwd, "new default", new_up, with_gather=True)
    sw.down(fwd, "new default", new_down)
    for s in ("7B-1024", "7B-256", "120B-2048"):
      _, d, n, _, _ = SHAPES[s]
      sw.dense_jobs(s, ["up", "down"])
      sw.up(s, "new default", cfgs.swiglu_gemm_config(d, n))
      sw.down(s, "new default", cfgs.plain_gemm_config(n, d))
  else:
    fwd, bwd = "30B-512", "120B-1024"
    W = WgradConfig
    # 1. The heuristic (current) configs and the swizzled-epilogue variant, most important.
    sw.dense_jobs(fwd, ["up", "down"])
    for name in ("ws2 bn64 s3 w8", "ws2 bn64 s3 w8 swz"):
      sw.up(fwd, name, up[name])
    for name in ("ws2 bn128 s3 w8", "ws2 bn128 s3 w8 swz"):
      sw.down(fwd, name, down[name])
    sw.dense_jobs(bwd, ["dh", "dw1", "dw2"])
    sw.dh(bwd, "128x128x64 s4 gbn8 epi64", DhConfig())
    sw.wgrad(bwd, "dw1", "128x128x64 s4 gbn1", W())
    sw.wgrad(bwd, "dw2", "128x128x64 s5 gbn4", W(max_concurrent_steps=5, grid_block_n=4))
    # 2. Tile-order width, stages, block_k, warpgroups.
    sw.up(fwd, "ws2 bn64 s3 w16", up["ws2 bn64 s3 w16"])
    sw.down(fwd, "1wg bn128 s5 w8 swz", down["1wg bn128 s5 w8 swz"])
    sw.down(fwd, "ws2 bn128 s3 w16", down["ws2 bn128 s3 w16"])
    sw.up(fwd, "1wg bn64 s4 w8 swz", up["1wg bn64 s4 w8 swz"])
    sw.wgrad(bwd, "dw1", "128x128x64 s5 gbn4", W(max_concurrent_steps=5, grid_block_n=4))
    sw.dh(bwd, "128x128x64 s4 gbn16", DhConfig(grid_block_n=16))
    s7 = "7B-1024"
    sw.dense_jobs(s7, ["up", "down"])
    for name in ("ws2 bn64 s3 w8", "ws2 bn64 s3 w8 swz"):
      sw.up(s7, name, up[name])
    for name in ("ws2 bn128 s3 w8", "ws2 bn128 s3 w8 swz"):
      sw.down(s7, name, down[name])
    for name in ("ws2 bn128 bk32 s6 w8", "ws2 bn64 s4 w8", "1wg bm64 bn256 s4 w8",
                 "ws2 bn128 s3 w4"):
      sw.down(fwd, name, down[name])
    for name in ("ws2 bn64 bk32 s6 w8", "ws2 bn64 s3 w4"):
      sw.up(fwd, name, up[name])
    for name, c in (("128x128x64 s6 gbn8", W(max_concurrent_steps=6, grid_block_n=8)),
                    ("128x128x128 s3 gbn1", W(block_k=128, max_concurrent_steps=3))):
      sw.wgrad(bwd, "dw1", name, c)
      sw.wgrad(bwd, "dw2", name, c)
    for name, c in (("128x128x64 s3 gbn8", DhConfig(max_concurrent_steps=3)),
                    ("128x128x128 s2 gbn8", DhConfig(block_k=128, max_concurrent_steps=2))):
      sw.dh(bwd, name, c)
    sw.up(fwd, "ws2 bn64 s3 w8", up["ws2 bn64 s3 w8"], with_gather=True)
    # 3. Other shapes: fine-grained 7B and large n.
    for s in ("7B-256", "120B-2048"):
      sw.dense_jobs(s, ["up", "down"])
      for name in ("ws2 bn64 s3 w8", "ws2 bn64 s3 w8 swz"):
        sw.up(s, name, up[name])
      for name in ("ws2 bn128 s3 w8", "ws2 bn128 s3 w8 swz"):
        sw.down(s, name, down[name])
  sw.log(f"done, {time.monotonic() - sw.t0:.0f} s")
  lines = ["| shape | kernel | variant | ms | TF/s | vs dense | rel err |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
  for r in sw.rows:
    if "error" in r:
      lines.append(f"| | {r['kernel']} | FAILED | | | | {r['error'][:120]} |")
    else:
      err = "" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
      lines.append(f"| {r['shape']} | {r['kernel']} | {r['variant']} | {r['ms']:.3f} | "
                   f"{r['tflops']:.1f} | {r['vs_dense']:.2f} | {err} |")
  sw.log("\n".join(lines))


if __name__ == "__main__":
  main()
