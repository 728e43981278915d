"""Pallas forward kernels on one GPU: correctness vs the xla backend / a dense reference, and
timings of every variant against an XLA dense matmul of the same total shape.

  python benchmarks/pallas_forward.py --out-dir benchmarks/results [--configs 7B-512,30B-512]

Writes pallas-forward-<gpu>-<date>.json and .md to --out-dir and prints a table last.
Timings are GPU-side (CUPTI, ``jax.experimental.mosaic.gpu.profiler.measure``, through
``sonic_jax.bench.timing``): the sum of the kernels of one call, median of ``--iters`` calls
after a warm-up, random bf16 data; the wall clock off a GPU or where CUPTI fails (each result's
``timer`` says which). FLOPs as the paper counts them: up_proj 4·TK·d·n, down_proj 2·TK·n·d,
forward 6·TK·d·n. ``--interpret`` runs the correctness part on a CPU in the Mosaic GPU
interpreter at a tiny shape (a smoke test).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sonic_jax.bench.runner import fwdbwd_step, rel_errs  # noqa: E402
from sonic_jax.bench.timing import Measured, compile_and_time  # noqa: E402
from sonic_jax.pallas import configs as cfgs  # noqa: E402
from sonic_jax.pallas import grouped_gemm as gg  # noqa: E402
from sonic_jax.pallas.backend import PallasKernels  # noqa: E402
from sonic_jax.routing import route_logits  # noqa: E402
from sonic_jax.xla_backend import XlaKernels  # noqa: E402

# The paper's configs (sonicmoe-spec.md §7.2) with SonicMoE's H100 forward TFLOP/s.
PAPER = {
    "1.4B-256": (40960, 768, 256, 128, 8, 335), "1.4B-512": (40960, 768, 512, 64, 4, 397),
    "1.4B-1024": (40960, 768, 1024, 32, 2, 403), "7B-256": (24576, 1536, 256, 128, 8, 363),
    "7B-512": (24576, 1536, 512, 64, 4, 431), "7B-1024": (24576, 1536, 1024, 32, 2, 463),
    "30B-256": (32768, 4096, 256, 256, 16, 428), "30B-512": (32768, 4096, 512, 128, 8, 503),
    "30B-1024": (32768, 4096, 1024, 64, 4, 552), "120B-512": (32768, 4096, 512, 256, 16, 518),
    "120B-1024": (32768, 4096, 1024, 128, 8, 558), "120B-2048": (32768, 4096, 2048, 64, 4, 595),
}
# Model presets of sonic_jax.bench (no paper figure): per-kernel breakdowns where the layer is slow.
PRESETS = {"DeepSeek-V3-like": (16384, 7168, 2048, 256, 8, None),
           "Mixtral-8x7B": (16384, 4096, 14336, 8, 2, None),
           "OLMoE-1B-7B": (16384, 2048, 1024, 64, 8, None),
           "Qwen3-30B-A3B": (16384, 2048, 768, 128, 8, None)}
DEFAULT_CONFIGS = "7B-256,7B-1024,30B-512,120B-2048"
PARTS = ("up", "down", "combine", "forward", "dx", "variants", "train")


def rel(a, b) -> float:
  """‖a − b‖ / ‖b‖ in float32 on the device (no float32 copy of a multi-GiB gradient: DeepSeek-
  V3-like's dW1 is 15 GB); inf when either holds a NaN or inf."""
  err = float(rel_errs(jnp.asarray(a), jnp.asarray(b)))
  return err if np.isfinite(err) else float("inf")


def timer(iters: int, log=print):
  """Returns time(f, *args) -> Measured: compile, one call (outputs, first-call time), then the
  median ms of iters calls (GPU-side CUPTI; the wall clock on a CPU or where CUPTI fails)."""

  def time_it(f, *args) -> Measured:
    m = compile_and_time(f, args, iters=iters)
    if m.timing.note:
      log(f"  ({m.timing.note})")
    return m
  return time_it


def make_problem(t, d, n, e, k, seed=0):
  ks = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(ks[0], (t, d), jnp.float32).astype(jnp.bfloat16)
  rw = (jax.random.normal(ks[1], (d, e), jnp.float32) / np.sqrt(d)).astype(jnp.bfloat16)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n), jnp.float32) / np.sqrt(d)).astype(jnp.bfloat16)
  w2 = (jax.random.normal(ks[3], (e, n, d), jnp.float32) / np.sqrt(n)).astype(jnp.bfloat16)
  logits = jnp.dot(x, rw, preferred_element_type=jnp.float32)
  plan = jax.jit(lambda lg: route_logits(lg, top_k=k))(logits)
  return x, rw, w1, w2, plan


def sampled_reference(lhs_rows, w, plan, experts):
  """Dense f32 reference rows for a few experts: {e: (rows slice, lhs[rows] @ w[e])}."""
  offs = np.asarray(plan.group_offsets)
  out = {}
  for e in experts:
    lo, hi = int(offs[e]), int(offs[e + 1])
    if hi > lo:
      out[e] = (lo, hi, jnp.dot(lhs_rows[lo:hi].astype(jnp.float32), w[e].astype(jnp.float32)))
  return out


def sampled_rel(result, ref) -> float:
  num = den = 0.0
  for lo, hi, r in ref.values():
    a = np.asarray(jnp.asarray(result[lo:hi], jnp.float32), np.float64)
    b = np.asarray(r, np.float64)
    if not np.isfinite(a).all():
      return float("inf")
    num += float(np.sum((a - b) ** 2))
    den += float(np.sum(b ** 2))
  return float(np.sqrt(num / max(den, 1e-30)))


# Earlier defaults, kept as explicit comparison points: the plain GEMMs' pipeline restarted per
# tile (session 2) and the fused up_proj with the consumers splitting the columns (session 4).
RESTARTED_PLAIN = cfgs.GemmConfig(block_m=128, block_n=128, block_k=32, max_concurrent_steps=6,
                                  grid_tile_width=16, num_compute_wgs=2)
SPLIT_N_FUSED_UP = cfgs.GemmConfig(block_m=128, block_n=64, block_k=32, max_concurrent_steps=6,
                                   grid_tile_width=16, num_compute_wgs=2, gather="fused",
                                   epilogue_swizzle=True)


def variants(d, n, fused: bool):
  """(name, PallasKernels) for the up/down variants compared: the heuristic table's choice, a
  single-warpgroup pipeline (no warp specialization) and optionally the fused gather."""
  single_up = cfgs.GemmConfig(block_m=128, block_n=64, block_k=64, max_concurrent_steps=4,
                              grid_tile_width=8)
  single_down = cfgs.GemmConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5,
                                grid_tile_width=8)
  up_h, down_h = cfgs.swiglu_gemm_config(d, n), cfgs.plain_gemm_config(n, d)
  out = [(f"heuristic wgs={up_h.num_compute_wgs}/{down_h.num_compute_wgs} {up_h.gather}",
          PallasKernels()),
         ("1wg", PallasKernels(config=cfgs.ForwardConfig(up_proj=single_up, down_proj=single_down,
                                                         dx_pairs=single_down)))]
  if down_h.cross_tile:
    out.append(("restarted", PallasKernels(config=cfgs.ForwardConfig(
        down_proj=RESTARTED_PLAIN, dx_pairs=RESTARTED_PLAIN))))
  if fused:  # the other gather mode than the heuristic's
    other = "xla" if up_h.gather == "fused" else "fused"
    out.append((f"{other}-gather", PallasKernels(config=cfgs.ForwardConfig(
        up_proj=cfgs.swiglu_gemm_config(d, n, gather=other)))))
  return out


def _ring_configs(variants):
  """GemmConfigs on the across-tiles ring (cross_tile, 2 consumers) from (name, fields)."""
  ring = dict(block_m=128, num_compute_wgs=2, cross_tile=True, grid_tile_width=16)
  return [(name, cfgs.GemmConfig(**{**ring, **fields})) for name, fields in variants]


def down_sweep(d, n):
  """down_proj / dx_pairs tilings on the across-tiles ring (``--down-sweep``):
  ([(name, kernels)] for down_proj, [(name, kernels)] for dx_pairs). Explicit tilings, not
  relative to the heuristic, so that names mean the same in every session's records."""
  if d % 256:
    return [], []
  bk32, bk64 = dict(block_k=32, max_concurrent_steps=6), dict(block_k=64, max_concurrent_steps=3)
  split = dict(block_n=256, wg_split="m")  # 64 x 256 per consumer warpgroup (m64n256 wgmmas)
  down = _ring_configs([
      ("ring bk32 s6", dict(block_n=128, **bk32)),
      ("ring bk64 s3", dict(block_n=128, **bk64)),
      ("ring bk64 s3 w8", dict(block_n=128, **bk64, grid_tile_width=8)),
      ("ring bk64 s3 swz", dict(block_n=128, **bk64, epilogue_swizzle=True)),
      ("ring split-m bk32 s6 swz", dict(**split, **bk32, epilogue_swizzle=True)),
      ("ring split-m bk64 s3", dict(**split, **bk64))])
  dx = _ring_configs([
      ("ring bk32 s6", dict(block_n=128, **bk32)),
      ("ring bk64 s3", dict(block_n=128, **bk64)),
      ("ring split-m bk32 s6", dict(**split, **bk32)),
      ("ring split-m bk64 s3", dict(**split, **bk64)),
      ("ring split-m bk64 s3 w8", dict(**split, **bk64, grid_tile_width=8))])
  ok = lambda c, k: gg.smem_bytes(c, epilogue="none") <= gg.SMEM_LIMIT and k % c.block_k == 0
  return ([(name, PallasKernels(config=cfgs.ForwardConfig(down_proj=c)))
           for name, c in down if ok(c, n)],
          [(name, PallasKernels(config=cfgs.ForwardConfig(dx_pairs=c)))
           for name, c in dx if ok(c, 2 * n)])


def fused_sweep(d, n):
  """Fused-gather up_proj tilings (``--fused-sweep``), explicit so that names mean the same in
  every session's records: the two consumer warpgroups splitting the columns (128 x 2·64 each,
  session 4's default) or the rows (64 x 2·128 each, session 6's), snake widths 16 and 8.
  (Session 4 measured block_k 64 x 3 stages and width 4 with the columns split: both slower.)"""
  if n % 128:
    return []
  split_m = dataclasses.replace(SPLIT_N_FUSED_UP, block_n=128, wg_split="m")
  out = [("fused split-n w16", SPLIT_N_FUSED_UP),
         ("fused split-m w16", split_m),
         ("fused split-m w8", dataclasses.replace(split_m, grid_tile_width=8)),
         # block_k 64 (128-byte gathered row chunks, half the ring's barriers per FLOP) with
         # the rows split: the same bytes in flight as 6 stages of 32 (untimed before session 7).
         ("fused split-m bk64 s3 w8", dataclasses.replace(
             split_m, block_k=64, max_concurrent_steps=3, grid_tile_width=8))]
  return [(name, PallasKernels(config=cfgs.ForwardConfig(up_proj=c))) for name, c in out]


def run_config(name, shape, args, log):
  t, d, n, e, k, paper_tf = shape
  tk = t * k
  rec = dict(config=name, T=t, d=d, n=n, E=e, K=k, paper_h100_fwd_tflops=paper_tf, results={},
             errors={})
  time_it = timer(args.iters, log)
  x, rw, w1, w2, plan = make_problem(t, d, n, e, k)
  xla = XlaKernels()
  offs = np.asarray(plan.group_offsets)
  sizes = np.asarray(plan.group_sizes)
  check_e = [int(np.argmax(sizes > 0)), e // 2, e - 1]
  xg = x[plan.gather_idx]
  ref_h = sampled_reference(xg, w1, plan, check_e)
  fl_up, fl_down = 4 * tk * d * n, 2 * tk * n * d

  def record(key, m: Measured, flops=None, **extra):
    ms = m.timing.median_ms
    r = dict(ms=ms, **extra)
    if flops:
      r["tflops"] = flops / (ms * 1e-3) / 1e12
    r["timer"] = m.timing.timer
    rec["results"][key] = r
    log(f"  {key:<34} {ms:8.3f} ms" + (f"  {r['tflops']:6.1f} TF/s" if flops else "")
        + "".join(f"  {a}={b:.3g}" if isinstance(b, float) else f"  {a}={b}"
                  for a, b in extra.items()))

  def guarded(key, fn):
    try:
      fn()
    except Exception as ex:  # noqa: BLE001 - record and go on with the other variants
      rec["errors"][key] = f"{type(ex).__name__}: {str(ex)[:2000]}"
      log(f"  {key}: FAILED {type(ex).__name__}: {str(ex)[:300]}")
      log(traceback.format_exc()[-3000:])

  # Baselines: XLA dense matmuls of the same total shape, the XLA gather, a copy.
  if not args.skip_baselines:
    a_dense = jax.random.normal(jax.random.key(9), (tk, n), jnp.float32).astype(jnp.bfloat16)
    guarded("xla_dense_up", lambda: record(
        "xla_dense_up", time_it(lambda a, b: a @ b, xg, w1[0]), fl_up))
    guarded("xla_dense_down", lambda: record(
        "xla_dense_down", time_it(lambda a, b: a @ b, a_dense, w2[0]), fl_down))
    guarded("xla_gather", lambda: record(
        "xla_gather", time_it(lambda a, i: a[i], x, plan.gather_idx),
        gb=2 * tk * d * 2 / 1e9))
    guarded("copy", lambda: record(
        "copy (-x_gathered)", time_it(lambda a: -a, xg), gb=2 * tk * d * 2 / 1e9))
  copy_ms = rec["results"].get("copy (-x_gathered)", {}).get("ms")
  if copy_ms:  # read + write bytes per second of an elementwise pass: the copy bandwidth
    rec["copy_gbps"] = 2 * tk * d * 2 / (copy_ms * 1e-3) / 1e9

  vars_up = variants(d, n, not args.no_fused)
  vars_down = variants(d, n, False)
  a_ref = jax.random.normal(jax.random.key(3), (plan.capacity, n), jnp.float32).astype(
      jnp.bfloat16)
  ref_y = sampled_reference(a_ref, w2, plan, check_e)
  g0 = slice(int(offs[check_e[0]]), int(offs[check_e[0] + 1]))
  gate_up = jnp.dot(xg[g0].astype(jnp.float32), w1[check_e[0]].astype(jnp.float32))
  a_chk = jax.nn.silu(gate_up[:, :n]) * gate_up[:, n:]

  def up(kern, vname):
    kern.validate(x, plan, w1, w2)
    m = time_it(kern.up_proj, x, w1, plan)
    h, a = m.out
    record(f"up_proj[{vname}]", m, fl_up, rel_err_h=sampled_rel(h, ref_h),
           rel_err_a=rel(a[g0], a_chk), first_call_s=m.first_call_s)

  def down(kern, vname):
    m = time_it(kern.down_proj, a_ref, w2, plan)
    record(f"down_proj[{vname}]", m, fl_down, rel_err_y=sampled_rel(m.out, ref_y))

  def dx(kern, vname):
    dh = jax.random.normal(jax.random.key(5), (plan.capacity, 2 * n), jnp.float32).astype(
        jnp.bfloat16)
    ref = sampled_reference(dh, jnp.swapaxes(w1, 1, 2), plan, check_e[:1])
    m = time_it(kern.dx_pairs, dh, w1, plan)
    record(f"dx_pairs[{vname}]", m, fl_up, rel_err=sampled_rel(m.out, ref))

  kern = PallasKernels(config=cfgs.ForwardConfig(combine=cfgs.combine_config(d, "mosaic")))
  y = jax.random.normal(jax.random.key(4), (plan.capacity, d), jnp.float32).astype(jnp.bfloat16)

  def comb():
    ref = xla.combine(y, plan, plan.scores, jnp.float32)
    m = time_it(lambda a, p: kern.combine(a, p, p.scores, jnp.bfloat16), y, plan)
    ms = m.timing.median_ms
    moved = tk * d * 2 + t * d * 2 + tk * 8
    gbps = moved / (ms * 1e-3) / 1e9
    record("combine[mosaic]", m, rel_err=rel(m.out, ref), gbps=gbps,
           frac_of_copy_bw=gbps / rec["copy_gbps"] if rec.get("copy_gbps") else float("nan"))
    m_x = time_it(lambda a, p: xla.combine(a, p, p.scores, jnp.bfloat16), y, plan)
    ms_x = m_x.timing.median_ms
    record("combine[xla]", m_x, gbps=moved / (ms_x * 1e-3) / 1e9,
           frac_of_copy_bw=(moved / (ms_x * 1e-3) / 1e9) / rec["copy_gbps"]
           if rec.get("copy_gbps") else float("nan"))

  # Whole forward (training: H is written): router GEMM + routing + metadata + kernels.
  def fwd(kern, vname):
    def f(x, rw, w1, w2):
      logits = jnp.dot(x, rw, preferred_element_type=jnp.float32)
      p = route_logits(logits, top_k=k)
      h, a = kern.up_proj(x, w1, p)
      yy = kern.down_proj(a, w2, p)
      return kern.combine(yy, p, p.scores, x.dtype), h
    m = time_it(f, x, rw, w1, w2)
    tf = 6 * tk * d * n / (m.timing.median_ms * 1e-3) / 1e12
    record(f"forward[{vname}]", m, 6 * tk * d * n, first_call_s=m.first_call_s,
           vs_paper=tf / paper_tf if paper_tf else float("nan"))

  # Whole layer forward + backward (sonic_jax.moe under jax.vjp, FLOPs 18·TK·d·n) with the
  # backward's gathers by XLA ("xla-gathers", named "default" in session 5's records, before
  # backward_gathers="auto" existed) or fused into dh / dw1 / dw2; the compiled program's
  # temporary bytes; gradients checked against the XLA-gather variant's.
  ct = jax.random.normal(jax.random.key(6), (t, d), jnp.float32).astype(jnp.bfloat16)
  train_ref = {}

  def train(kern, vname):
    import sonic_jax

    # The layer benchmark's step: output and gradients (with the gradients alone XLA would drop
    # down_proj and the combine).
    step = fwdbwd_step(lambda *a: sonic_jax.moe(*a, top_k=k, backend=kern))
    m = time_it(lambda *a: step(*a, ct), x, rw, w1, w2)
    grads = m.out[1]
    mem = m.compiled.memory or {}
    temp = mem.get("temp_size_in_bytes", float("nan"))
    # Above weights and inputs, as the layer benchmark and SonicMoE report it: temporaries plus
    # the output and the gradients written (dx, drouter, dW1, dW2).
    extra = temp + mem.get("output_size_in_bytes", float("nan"))
    errs = {}
    if train_ref:
      errs = {f"rel_{nm}": rel(a, b) for nm, a, b in
              zip(("dx", "drouter", "dw1", "dw2"), grads, train_ref["grads"])}
    else:
      train_ref["grads"] = grads
    record(f"train[{vname}]", m, 18 * tk * d * n, temp_gib=temp / 2**30, extra_gib=extra / 2**30,
           first_call_s=m.first_call_s, **errs)

  def train_variants():
    from sonic_jax.pallas.dh import dh_config_for
    from sonic_jax.pallas.wgrad import wgrad_config_for
    fw = dict(dw1=wgrad_config_for(d, 2 * n, gather="fused"),
              dw2=wgrad_config_for(n, d, gather="fused"))
    out = [("xla-gathers", PallasKernels(backward_gathers="xla"))]
    if n % 256 == 0 and d % 128 == 0:  # where wgrad_config_for picks two consumer warpgroups
      fw2 = dict(dw1=wgrad_config_for(d, 2 * n, gather="fused", gathered="lhs"),
                 dw2=wgrad_config_for(n, d, gather="fused", gathered="rhs"))
      out.append(("fused-wgrad-2wg", PallasKernels(config=cfgs.ForwardConfig(**fw2))))
      out.append(("fused-bwd-2wg", PallasKernels(config=cfgs.ForwardConfig(
          dh=dh_config_for(d, n, gather="fused"), **fw2))))
    if args.train_tilings:  # session 6's forward tilings against session 5's, one at a time
      out = [("default", PallasKernels()),
             ("s5-tilings", PallasKernels(config=cfgs.ForwardConfig(
                 up_proj=SPLIT_N_FUSED_UP, down_proj=RESTARTED_PLAIN,
                 dx_pairs=RESTARTED_PLAIN))),
             ("s5-dx", PallasKernels(config=cfgs.ForwardConfig(dx_pairs=RESTARTED_PLAIN))),
             ("s5-up", PallasKernels(config=cfgs.ForwardConfig(up_proj=SPLIT_N_FUSED_UP)))]
    if args.train_mixes and n % 256 == 0 and d % 128 == 0:
      # Per-kernel gather modes: which gathered (P, d) copy (x for dW1, dO for dh and dW2) is
      # worth its memory; "default" is backward_gathers="auto".
      fdh = dh_config_for(d, n, gather="fused")
      xw1 = wgrad_config_for(d, 2 * n, gather="xla", gathered="lhs")
      out = [("default", PallasKernels()),
             # dW1 where XLA schedules it (before session 8's optimization barrier).
             ("dw1-early", PallasKernels(dw1_last=False)),
             ("xla-gathers", PallasKernels(backward_gathers="xla")),
             ("fused-dw1", PallasKernels(backward_gathers="fused-x")),
             ("fused-dO", PallasKernels(config=cfgs.ForwardConfig(
                 dh=fdh, dw1=xw1, dw2=fw2["dw2"]))),
             ("fused-bwd-2wg", PallasKernels(backward_gathers="fused")),
             # The default again, last: drift over the run (4 % between two identical
             # variants at 120B-1024 in session 7) shows as a gap between the two.
             ("default-again", PallasKernels())]
    if args.train_only:
      keep = set(args.train_only.split(","))
      out = [(vn, kv) for vn, kv in out if vn in keep]
    if args.train_all:
      out += [("fused-wgrad", PallasKernels(config=cfgs.ForwardConfig(**fw))),
              ("fused-bwd", PallasKernels(config=cfgs.ForwardConfig(
                  dh=dh_config_for(d, n, gather="fused"), **fw)))]
    return out

  # Most important first: a timeout then loses only the extra variants.
  (hname, hkern), rest_up, rest_down = vars_up[0], vars_up[1:], vars_down[1:]
  parts = set(args.parts.split(","))
  fused = [(vn, kv) for vn, kv in rest_up if vn.endswith("-gather")]
  if "up" in parts:
    guarded(f"up_proj[{hname}]", lambda: up(hkern, hname))
    for vname, kv in fused:
      guarded(f"up_proj[{vname}]", lambda: up(kv, vname))
  if "down" in parts:
    guarded(f"down_proj[{hname}]", lambda: down(hkern, hname))
  if "combine" in parts:
    guarded("combine", comb)
  if "forward" in parts:
    guarded(f"forward[{hname}]", lambda: fwd(hkern, hname))
    for vname, kv in fused:
      guarded(f"forward[{vname}]", lambda: fwd(kv, vname))
  if "dx" in parts:
    guarded(f"dx_pairs[{hname}]", lambda: dx(hkern, hname))
  if args.fused_sweep and "up" in parts:
    for vname, kv in fused_sweep(d, n):
      guarded(f"up_proj[{vname}]", lambda: up(kv, vname))
  if args.down_sweep:
    down_vars, dx_vars = down_sweep(d, n)
    for vname, kv in down_vars:
      guarded(f"down_proj[{vname}]", lambda: down(kv, vname))
    if "dx" in parts:
      for vname, kv in dx_vars:
        guarded(f"dx_pairs[{vname}]", lambda: dx(kv, vname))
  if "train" in parts:
    for vname, kv in train_variants():
      guarded(f"train[{vname}]", lambda: train(kv, vname))
  if "variants" in parts:
    for vname, kv in rest_up:
      if not vname.endswith("-gather") and vname != "restarted":  # restarted: down / dx
        guarded(f"up_proj[{vname}]", lambda: up(kv, vname))
    for vname, kv in rest_down:
      guarded(f"down_proj[{vname}]", lambda: down(kv, vname))
      if vname == "restarted":
        guarded(f"dx_pairs[{vname}]", lambda: dx(kv, vname))
  return rec


def xla_backend_check(log, interpret=False):
  """Every forward entry point vs the xla backend (relative error, H/A/Y/out separately)."""
  t, d, n, e, k = (4096, 1024, 512, 24, 4) if not interpret else (100, 64, 64, 5, 2)
  x, rw, w1, w2, plan = make_problem(t, d, n, e, k, seed=1)
  xla = XlaKernels()
  out = {}
  if interpret:
    small = dict(block_m=64, block_k=64, max_concurrent_steps=2, num_sms=2)
    kerns = [("interpret", PallasKernels(interpret=True, config=cfgs.ForwardConfig(
        up_proj=cfgs.GemmConfig(block_n=64, **small),
        down_proj=cfgs.GemmConfig(block_n=64, **small),
        dx_pairs=cfgs.GemmConfig(block_n=64, **small),
        combine=cfgs.CombineConfig(impl="mosaic", block_d=64, slots=2, num_sms=2))))]
  else:
    kerns = [("heuristic", PallasKernels()),
             ("fused-gather", PallasKernels(config=cfgs.ForwardConfig(
                 up_proj=cfgs.swiglu_gemm_config(d, n, gather="fused"))))]
  h_ref, a_ref = jax.jit(xla.up_proj)(x, w1, plan)
  y_ref = jax.jit(xla.down_proj)(a_ref, w2, plan)
  o_ref = xla.combine(y_ref, plan, plan.scores, jnp.float32)
  dx_ref = jax.jit(xla.dx_pairs)(h_ref, w1, plan)
  for name, kern in kerns:
    r = {}
    try:
      h, a = jax.jit(kern.up_proj)(x, w1, plan)
      r["H"], r["A"] = rel(h, h_ref), rel(a, a_ref)
      r["Y"] = rel(jax.jit(kern.down_proj)(a_ref, w2, plan), y_ref)
      r["out"] = rel(kern.combine(y_ref, plan, plan.scores, jnp.float32), o_ref)
      r["dx_out"] = rel(kern.combine(y_ref, plan, None, jnp.float32),
                        xla.combine(y_ref, plan, None, jnp.float32))
      r["dx_pairs"] = rel(jax.jit(kern.dx_pairs)(h_ref, w1, plan), dx_ref)
    except Exception as ex:  # noqa: BLE001
      r["error"] = f"{type(ex).__name__}: {str(ex)[:2000]}"
      log(traceback.format_exc()[-3000:])
    out[name] = r
    log(f"xla-backend check [{name}] (T={t} d={d} n={n} E={e} K={k}): {r}")
  return out


def _timers(data) -> list[str]:
  """The timer kinds of the recorded results (``Timing.timer``)."""
  return sorted({r["timer"] for rec in data["configs"] for r in rec["results"].values()
                 if "timer" in r}) or ["none"]


def write_reports(data, out_dir, stem):
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, stem + ".json"), "w") as f:
    json.dump(data, f, indent=1, default=str)
  lines = [f"# Pallas forward kernels, {data['gpu']}, {data['date']}", "",
           f"jax {data['jax']}, command: `{data['command']}`", "",
           "GPU-side (CUPTI) kernel time per call, median of "
           f"{data['iters']} calls after a warm-up (timers: {', '.join(_timers(data))}; wall: "
           "the host clock, off a GPU or where CUPTI failed); random bf16 data; FLOPs: up "
           "4·TK·d·n, "
           "down 2·TK·n·d, forward 6·TK·d·n. `vs dense` = kernel TFLOP/s ÷ the XLA dense "
           "matmul of the same total shape in the same run.", "",
           "## Correctness vs the xla backend", ""]
  for k, v in data.get("xla_check", {}).items():
    lines.append(f"- {k}: " + ", ".join(f"{a} {b:.2e}" if isinstance(b, float) else f"{a} {b}"
                                        for a, b in v.items()))
  lines += ["", "## Timings", "",
            "| config | T | d | n | E | K | kernel | ms | TF/s | vs dense | notes |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
  for rec in data["configs"]:
    res = rec["results"]
    dense = {"up": res.get("xla_dense_up", {}).get("tflops"),
             "down": res.get("xla_dense_down", {}).get("tflops")}
    for key, r in res.items():
      kind = "up" if key.startswith("up_proj") else "down" if key.startswith("down_proj") else None
      vs = (f"{r['tflops'] / dense[kind]:.2f}" if kind and dense[kind] and "tflops" in r
            else "")
      notes = ", ".join(f"{a}={b:.3g}" if isinstance(b, float) else f"{a}={b}"
                        for a, b in r.items() if a not in ("ms", "tflops", "timer"))
      if key.startswith("forward"):
        notes += f", paper H100 fwd {rec['paper_h100_fwd_tflops']} TF/s"
      lines.append(f"| {rec['config']} | {rec['T']} | {rec['d']} | {rec['n']} | {rec['E']} | "
                   f"{rec['K']} | {key} | {r['ms']:.3f} | "
                   f"{r.get('tflops', float('nan')):.1f} | {vs} | {notes} |")
    for key, err in rec["errors"].items():
      lines.append(f"| {rec['config']} | | | | | | {key} | FAILED | | | {err[:200]!r} |")
  with open(os.path.join(out_dir, stem + ".md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                  help="comma-separated names of PAPER (e.g. 30B-512) or PRESETS "
                       "(DeepSeek-V3-like, Mixtral-8x7B, OLMoE-1B-7B, Qwen3-30B-A3B), or 'all' (the paper's)")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
  ap.add_argument("--interpret", action="store_true")
  ap.add_argument("--no-fused", action="store_true",
                  help="skip the up_proj with the gather mode the heuristic does not pick")
  ap.add_argument("--parts", default=",".join(PARTS),
                  help=f"comma-separated subset of {','.join(PARTS)} (the fused-gather variant "
                       "runs with up and forward)")
  ap.add_argument("--skip-check", action="store_true")
  ap.add_argument("--train-mixes", action="store_true",
                  help="train part: per-kernel backward gather modes (fused dW1 only, fused "
                       "dh + dW2 only) against auto, all-XLA and all-fused")
  ap.add_argument("--train-only", default="",
                  help="train part: comma-separated variant names to keep (e.g. "
                       "default,fused-dw1,default-again); empty keeps all")
  ap.add_argument("--train-all", action="store_true",
                  help="train part: also the single-consumer fused wgrad variants")
  ap.add_argument("--skip-baselines", action="store_true",
                  help="skip the XLA dense / gather / copy baselines")
  ap.add_argument("--train-tilings", action="store_true",
                  help="train part: the default against session 5's forward tilings (all, "
                       "dx_pairs only, up_proj only) instead of the gather variants")
  ap.add_argument("--down-sweep", action="store_true",
                  help="also time down_proj (and dx_pairs with --parts dx) on the across-tiles "
                       "ring (GemmConfig.cross_tile) with a few explicit tilings")
  ap.add_argument("--fused-sweep", action="store_true",
                  help="also time a few other fused-gather up_proj tilings")
  args = ap.parse_args()
  dev = jax.devices()[0]
  gpu = getattr(dev, "device_kind", dev.platform)
  date = datetime.date.today().isoformat()
  stem = "pallas-forward-" + ("h200" if "H200" in gpu else dev.platform) + "-" + date
  logf = open(os.path.join(args.out_dir, stem + ".log"), "w") if os.path.isdir(args.out_dir) \
      else None

  def log(msg):
    print(msg, flush=True)
    if logf:
      logf.write(msg + "\n")
      logf.flush()

  data = dict(gpu=gpu, date=date, jax=jax.__version__, python=platform.python_version(),
              command="python " + " ".join(sys.argv), iters=args.iters, configs=[])
  if not args.skip_check:
    data["xla_check"] = xla_backend_check(log, interpret=args.interpret)
  if not args.interpret:
    shapes = {**PAPER, **PRESETS}
    names = list(PAPER) if args.configs == "all" else [c for c in args.configs.split(",") if c]
    for name in names:
      log(f"== {name} {shapes[name][:5]}")
      data["configs"].append(run_config(name, shapes[name], args, log))
      write_reports(data, args.out_dir, stem)
  print(write_reports(data, args.out_dir, stem))


if __name__ == "__main__":
  main()
