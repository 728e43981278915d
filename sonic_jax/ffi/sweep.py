"""Tile-schedule sweep of the ffi backend's grouped GEMMs and the layer timing it leads to (GPU).

  python -m sonic_jax.ffi.sweep [--configs T,d,n,E,K ...] [--iters 10] [--json out.json]
                                [--gemms-only | --layer-only | --fused-gather-only | ...]

For each (T, d, n, E, K): top-K routing from random logits and random bf16 data; every grouped
GEMM of the layer (inputs gathered beforehand) under every tile schedule instantiated for its
kind (sonic_jax.ffi.schedules.INSTANTIATED), each checked against the first schedule's result,
next to an XLA dense matmul of the same total shape; the up_proj entry point as session 1 built
it (fp32 accumulator + SwiGLU kernel) and as now (bf16 H from the GEMM); then the layer forward
and forward+backward (``sonic_jax.moe(..., backend="ffi")``) with the kinds' default schedules
and with the fastest schedule of each GEMM (--layer-only: the layer with the table as it
is; the forward+backward row is the layer benchmark's whole training step, output and
gradients). The opt-in fused gather (``FfiKernels(fused_gather=True)``, GitHub issue #5): the gathered
up_proj and dh GEMMs under each of their schedules against gather_rows + the TMA grouped GEMM
(checked against it), and the layer with fused_gather=True under each ``gather_schedule``
(also with --layer-only).
Prints the ``MEASURED`` entries for schedules.py. --fused-epilogue-only: the up_proj and dh
entry points and the layer under each of ``EPILOGUE_VARIANTS`` (SwiGLU / dSwiGLU separate or in
the GEMM's epilogue, fused_epilogue "none", "dh" and "both", the fused ones also with
gather_schedule "tma_b", "cp_async", "noinc", "tma_b_c1", "pingpong" and "pingpong_c1"
besides "auto", and "up_gemm" / "up_gemm_pp": up_proj_epilogue="gemm" / "gemm_pingpong";
--epilogue-variants picks some), each checked against the separate
one, and each schedule of the two fused kernels (config 14's SwiGLU on the gathered copy).
--elementwise-only: the dSwiGLU kernel a block per row against a warp per row
(``FfiKernels(dswiglu=...)``, checked against each other) and the SwiGLU kernel, with the
bandwidth each reaches on the bytes it must move, next to a device-to-device copy of as many bytes.
GPU time: CUPTI kernel time (jax.experimental.mosaic.gpu.profiler.measure, through
sonic_jax.bench.timing), median of --iters; each row's ``timer`` says "cupti" or "wall" (the
fallback when CUPTI fails).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import sonic_jax
from sonic_jax import experts
from sonic_jax.bench.runner import fwdbwd_step
from sonic_jax.bench.timing import compile_and_time
from sonic_jax.ffi import ops, schedules
from sonic_jax.ffi.backend import GATHER_SCHEDULES, FfiKernels
from sonic_jax.ffi.schedules import GemmKind
from sonic_jax.routing import route_logits


def gpu_ms(f, *args, iters: int) -> tuple[float, str, object]:
  """Median CUPTI kernel time of f(*args) in ms after a compile + warm-up call, the timer
  ("wall" where CUPTI failed; the reason is printed) and the warm-up call's outputs."""
  m = compile_and_time(f, args, iters=iters)
  if m.timing.note:
    print(f"  ({m.timing.note})", flush=True)
  return m.timing.median_ms, m.timing.timer, m.out


def _rel(a, b) -> float:
  a = np.asarray(jnp.asarray(a, jnp.float32))
  b = np.asarray(jnp.asarray(b, jnp.float32))
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    return float("nan")
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _layer_rows(moe, x, router_w, w1, w2, cot, k):
  """[(name, jitted fn, args, flops)] of the layer forward and of the whole training step
  (``runner.fwdbwd_step``: the output and the gradients, as the layer benchmark times it; with
  the gradients alone XLA drops the forward's down projection and combine)."""
  t, d = x.shape
  n = w2.shape[1]
  return [("layer fwd", jax.jit(moe), (x, router_w, w1, w2), 6 * t * k * d * n),
          ("layer fwd+bwd", jax.jit(fwdbwd_step(moe)), (x, router_w, w1, w2, cot),
           18 * t * k * d * n)]


def _configs_to_time(kind, only):
  """The schedules of `kind` a sweep times: every instantiated one, or with `only` (config
  names) the kind's default first (the reference) and those of `only` it instantiates; none
  when it instantiates none of them."""
  cfgs = schedules.INSTANTIATED[kind]
  if only is None:
    return cfgs
  named = [c for c in cfgs if c.name in only]
  if not named:
    return ()
  default = schedules.DEFAULT[kind]
  return (default, *(c for c in named if c != default))


def run_config(t, d, n, e, k, iters, sweep=True, fused_only=False, gemms_only=False, only=None):
  """One (T, d, n, E, K): sweep (every schedule) or only the layer; fused_only: the fused-gather
  GEMMs against gather_rows + GEMM and the layer with and without the fused gather; gemms_only:
  the plain GEMMs under every schedule and the layer with the default and the swept table;
  only: config names, to time just those (and each kind's default) in the GEMM sweep."""
  full = sweep and not fused_only
  ks = jax.random.split(jax.random.key(0), 8)
  plan = route_logits(jax.random.normal(ks[0], (t, e), jnp.float32), top_k=k)
  rows = int(plan.group_offsets[-1])
  bf, f32 = jnp.bfloat16, jnp.float32
  x = jax.random.normal(ks[1], (t, d), bf)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n)) / np.sqrt(d)).astype(bf)
  w2 = (jax.random.normal(ks[3], (e, n, d)) / np.sqrt(n)).astype(bf)
  dout = jax.random.normal(ks[4], (t, d), bf)
  offs = plan.group_offsets
  xg, dog = x[plan.gather_idx], dout[plan.gather_idx]
  a = jax.random.normal(ks[5], (plan.capacity, n), bf)
  dh = jax.random.normal(ks[6], (plan.capacity, 2 * n), bf)

  def dense(lhs_t, out_dtype):
    if lhs_t:  # (P, M)ᵀ · (P, N)
      return jax.jit(lambda l, r: jax.lax.dot_general(
          l, r, (((0,), (0,)), ((), ())), preferred_element_type=out_dtype))
    return jax.jit(lambda l, r: jnp.dot(l, r, preferred_element_type=out_dtype))

  # name, kind, args, schedule dims (see schedules.pick), dense fn + args, flops
  cases = [
      ("up_proj x·W1 (bf16 H)", GemmKind.VARLEN_M_NN_BF16, (xg, w1), (2 * n, d),
       dense(False, bf), (xg[:rows], w1[0]), 2 * rows * d * 2 * n),
      ("down_proj A·W2", GemmKind.VARLEN_M_NN_BF16, (a, w2), (d, n),
       dense(False, bf), (a[:rows], w2[0]), 2 * rows * n * d),
      ("dh dO·W2ᵀ (fp32)", GemmKind.VARLEN_M_NT_F32, (dog, w2), (n, d),
       dense(False, f32), (dog[:rows], w2[0].T), 2 * rows * d * n),
      ("dx_pairs dH·W1ᵀ", GemmKind.VARLEN_M_NT_BF16, (dh, w1), (d, 2 * n),
       dense(False, bf), (dh[:rows], w1[0].T), 2 * rows * 2 * n * d),
      # The backend's weight-gradient kind (bf16 out, fp32 accumulation) against a dense
      # matmul with the same output dtype.
      ("dw1 Xgᵀ·dH", GemmKind.VARLEN_K_BF16, (xg, dh), (d, 2 * n),
       dense(True, bf), (xg[:rows], dh[:rows]), 2 * rows * d * 2 * n),
      ("dw2 A'ᵀ·dOg", GemmKind.VARLEN_K_BF16, (a, dog), (n, d),
       dense(True, bf), (a[:rows], dog[:rows]), 2 * rows * n * d),
  ]
  out, best = [], {}
  valid = np.arange(plan.capacity) < rows
  for name, kind, args, dims, fd, dargs, flops in (cases if full else []):
    cfgs = _configs_to_time(kind, only)
    if not cfgs:
      continue
    ms_d, timer_d, _ = gpu_ms(fd, *dargs, iters=iters)
    ref = None
    timings = {}
    for cfg in cfgs:
      f = jax.jit(lambda l, r, o, c=int(cfg), kd=kind: ops.grouped_gemm(l, r, o, kd, config=c))
      ms, timer, res = gpu_ms(f, *args, offs, iters=iters)
      if kind not in schedules.VARLEN_K_KINDS:
        res = res[valid]
      err = 0.0 if ref is None else _rel(res, ref)
      ref = res if ref is None else ref
      timings[cfg] = ms
      out.append(dict(kind="gemm", name=name, config=cfg.name, ffi_ms=ms, dense_ms=ms_d,
                      ffi_tflops=flops / ms / 1e9, dense_tflops=flops / ms_d / 1e9,
                      ratio=ms_d / ms, rel_err_vs_first=err, timer=timer,
                      dense_timer=timer_d))
      print(f"  {name:22s} {cfg.name:26s} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TF/s | dense "
            f"{ms_d:7.3f} ms {flops / ms_d / 1e9:5.0f} TF/s | x{ms_d / ms:.2f} | err {err:.1e}",
            flush=True)
      if not err < 1e-2:
        print(f"  !! {name} {cfg.name} disagrees with the first schedule (rel err {err})")
        timings.pop(cfg)
    best[(kind, *dims)] = min(timings, key=timings.get)

  # Fused gather (issue #5): the GEMM reads rows through gather_idx vs gather_rows + TMA GEMM.
  fused_cases = [
      ("up_proj gather·W1 (bf16 H)", GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_GATHER_NN_BF16,
       x, w1, (2 * n, d), 2 * rows * d * 2 * n),
      ("dh gather·W2ᵀ (fp32)", GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_M_GATHER_NT_F32,
       dout, w2, (n, d), 2 * rows * d * n),
  ]
  for name, plain, fused, src, w, dims, flops in (
      fused_cases if (sweep or fused_only) and not gemms_only else []):
    f_sep = jax.jit(lambda s_, i, w_, o, kd=plain: ops.grouped_gemm(ops.gather_rows(s_, i, o), w_,
                                                                     o, kd))
    ms_sep, timer_sep, ref = gpu_ms(f_sep, src, plan.gather_idx, w, offs, iters=iters)
    ref = ref[valid]
    print(f"  {name:26s} gather_rows + {schedules.pick(plain, *dims).name:26s} {ms_sep:7.3f} ms "
          f"{flops / ms_sep / 1e9:5.0f} TF/s", flush=True)
    timings = {}
    for cfg in schedules.INSTANTIATED[fused]:
      f = jax.jit(lambda s_, i, w_, o, c=int(cfg), kd=fused: ops.gathered_grouped_gemm(
          s_, i, w_, o, kd, config=c))
      ms, timer, res = gpu_ms(f, src, plan.gather_idx, w, offs, iters=iters)
      err = _rel(res[valid], ref)
      out.append(dict(kind="fused_gather", name=name, config=cfg.name, ffi_ms=ms,
                      separate_ms=ms_sep, ffi_tflops=flops / ms / 1e9, speedup=ms_sep / ms,
                      rel_err_vs_separate=err, timer=timer, separate_timer=timer_sep))
      print(f"  {name:26s} fused {cfg.name:34s} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TF/s | "
            f"x{ms_sep / ms:.2f} vs separate | err {err:.1e}", flush=True)
      if not err < 1e-2:
        print(f"  !! {name} {cfg.name} disagrees with gather_rows + GEMM (rel err {err})")
      else:
        timings[cfg] = ms
    if timings:
      best[(fused, *dims)] = min(timings, key=timings.get)

  # up_proj entry point: session 1 (fp32 accumulator, SwiGLU kernel reading it) vs now.
  def up_v1(x, w1, plan):
    acc = ops.grouped_gemm(ops.gather_rows(x, plan.gather_idx, plan.group_offsets), w1,
                           plan.group_offsets, GemmKind.VARLEN_M_NN_F32)
    return ops.swiglu(acc, plan.group_offsets)

  def up_v2(x, w1, plan):
    h = ops.grouped_gemm(ops.gather_rows(x, plan.gather_idx, plan.group_offsets), w1,
                         plan.group_offsets, GemmKind.VARLEN_M_NN_BF16)
    return h, ops.swiglu_from_h(h, plan.group_offsets)

  if full and not gemms_only:
    (h1, a1), (h2, a2) = jax.jit(up_v1)(x, w1, plan), jax.jit(up_v2)(x, w1, plan)
    errs = dict(h=_rel(h2[valid], h1[valid]), a=_rel(a2[valid], a1[valid]))
    for name, f in (("entry up_proj v1 (fp32 acc)", up_v1), ("entry up_proj v2 (bf16 H)", up_v2)):
      ms, timer, _ = gpu_ms(jax.jit(f), x, w1, plan, iters=iters)
      out.append(dict(kind="entry", name=name, ffi_ms=ms,
                      ffi_tflops=2 * rows * d * 2 * n / ms / 1e9, v2_vs_v1_rel_err=errs,
                      timer=timer))
      print(f"  {name:30s} {ms:7.3f} ms  (v2 vs v1 rel err H {errs['h']:.1e} A {errs['a']:.1e})")

  router_w = (jax.random.normal(ks[7], (d, e)) / np.sqrt(d)).astype(bf)
  cot = jax.random.normal(jax.random.key(1), (t, d), bf)
  saved = dict(schedules.MEASURED)
  for table in (("default", "swept") if full else ("table",)):
    if table == "default":
      schedules.MEASURED.clear()
    elif table == "swept":
      schedules.MEASURED.update(best)
    # Fresh traces for each table: jit and the custom_vjp block cache traced functions.
    jax.clear_caches()
    experts._expert_block.cache_clear()
    moe = lambda x, r, w1, w2: sonic_jax.moe(x, r, w1, w2, top_k=k, backend="ffi")
    for name, f, args, flops in _layer_rows(moe, x, router_w, w1, w2, cot, k):
      ms, timer, _ = gpu_ms(f, *args, iters=iters)
      out.append(dict(kind="layer", name=name, table=table, ffi_ms=ms,
                      ffi_tflops=flops / ms / 1e9, timer=timer))
      print(f"  {name:14s} [{table:7s}] {ms:8.3f} ms {flops / ms / 1e9:5.0f} TF/s", flush=True)
  schedules.MEASURED.clear()
  schedules.MEASURED.update(saved)
  # The layer with the fused gather (opt-in) under the table as it is, with either B path.
  for sched in (() if gemms_only else GATHER_SCHEDULES):
    jax.clear_caches()
    experts._expert_block.cache_clear()
    fused_k = FfiKernels(fused_gather=True, gather_schedule=sched)
    table = f"fused_gather {sched}"
    moe_f = lambda x, r, w1, w2, b=fused_k: sonic_jax.moe(x, r, w1, w2, top_k=k, backend=b)
    for name, f, args, flops in _layer_rows(moe_f, x, router_w, w1, w2, cot, k):
      ms, timer, _ = gpu_ms(f, *args, iters=iters)
      out.append(dict(kind="layer", name=name, table=table, ffi_ms=ms,
                      ffi_tflops=flops / ms / 1e9, timer=timer))
      print(f"  {name:14s} [{table}] {ms:8.3f} ms {flops / ms / 1e9:5.0f} TF/s", flush=True)
  picks = {f"({k[0].name}, {k[1]}, {k[2]})": v.name for k, v in best.items()}
  print("  MEASURED entries:", picks)
  return out, picks


# name -> backend; "separate" (the reference of the others) always runs first.
def _epilogue_kernels(**kw) -> FfiKernels:
  """FfiKernels with the gathers as sessions 16-18 compared the epilogues (gathered copies for
  the entry points without a fused epilogue, not the default's "auto")."""
  return FfiKernels(fused_gather=False, wgrad_gather=False, **kw)


EPILOGUE_VARIANTS = {
    "separate": _epilogue_kernels(fused_epilogue="none"),
    "dh": _epilogue_kernels(fused_epilogue="dh"),
    "both": _epilogue_kernels(fused_epilogue="both"),
    # SwiGLU in the epilogue of config 14's GEMM over the gathered copy (FfiKernels'
    # up_proj_epilogue="gemm"), dh's dSwiGLU separate.
    "up_gemm": _epilogue_kernels(up_proj_epilogue="gemm"),
    "up_gemm_pp": _epilogue_kernels(up_proj_epilogue="gemm_pingpong"),
    **{f"{fused}:{sched}": _epilogue_kernels(fused_epilogue=fused, gather_schedule=sched)
       for sched in GATHER_SCHEDULES if sched != "auto" for fused in ("dh", "both")},
}


def run_fused_epilogue(t, d, n, e, k, iters, variants=None):
  """up_proj, dh and the layer under EPILOGUE_VARIANTS (those named in ``variants``, default
  all), each checked against "separate"."""
  variants = list(EPILOGUE_VARIANTS) if variants is None else ["separate", *variants]
  ks = jax.random.split(jax.random.key(0), 8)
  plan = route_logits(jax.random.normal(ks[0], (t, e), jnp.float32), top_k=k)
  rows = int(plan.group_offsets[-1])
  valid = np.arange(plan.capacity) < rows
  bf, f32 = jnp.bfloat16, jnp.float32
  x = jax.random.normal(ks[1], (t, d), bf)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n)) / np.sqrt(d)).astype(bf)
  w2 = (jax.random.normal(ks[3], (e, n, d)) / np.sqrt(n)).astype(bf)
  dout = jax.random.normal(ks[4], (t, d), bf)
  h = jax.random.normal(ks[5], (plan.capacity, 2 * n), bf)
  s = jax.random.uniform(ks[6], (plan.capacity,), f32, 0.1, 1.0)
  router_w = (jax.random.normal(ks[7], (d, e)) / np.sqrt(d)).astype(bf)
  cot = jax.random.normal(jax.random.key(1), (t, d), bf)
  out, refs = [], {}
  for vname in dict.fromkeys(variants):
    kern = EPILOGUE_VARIANTS[vname]
    jax.clear_caches()
    experts._expert_block.cache_clear()
    moe = lambda x, r, w1, w2, b=kern: sonic_jax.moe(x, r, w1, w2, top_k=k, backend=b)
    cases = [
        ("up_proj", jax.jit(lambda x, w, pl, b=kern: b.up_proj(x, w, pl)), (x, w1, plan),
         2 * rows * d * 2 * n),
        ("dh", jax.jit(lambda o, w, hh, ss, pl, b=kern: b.dh(o, w, hh, ss, pl)),
         (dout, w2, h, s, plan), 2 * rows * d * n),
        *_layer_rows(moe, x, router_w, w1, w2, cot, k),
    ]
    for name, f, args, flops in cases:
      ms, timer, res = gpu_ms(f, *args, iters=iters)
      res = [r for r in jax.tree.leaves(res)]
      if name in ("up_proj", "dh"):
        res = [r[valid] for r in res]
      if name not in refs:
        refs[name] = res
        err = 0.0
      else:
        err = max(_rel(a, b) for a, b in zip(res, refs[name]))
      out.append(dict(kind="fused_epilogue", name=name, variant=vname, ffi_ms=ms,
                      ffi_tflops=flops / ms / 1e9, rel_err_vs_separate=err, timer=timer))
      print(f"  {name:14s} [{vname:22s}] {ms:8.3f} ms {flops / ms / 1e9:5.0f} TF/s | err vs "
            f"separate {err:.1e}", flush=True)
  # Each schedule of the fused kinds on its own (rows gathered in the kernel).
  idx, offs = plan.gather_idx, plan.group_offsets
  for name, kind, f, args, flops in (
      ("up_proj_swiglu", GemmKind.VARLEN_M_GATHER_SWIGLU, ops.up_proj_swiglu, (x, idx, w1, offs),
       2 * rows * d * 2 * n),
      ("dh_dswiglu", GemmKind.VARLEN_M_GATHER_DSWIGLU, ops.dh_dswiglu, (dout, idx, w2, h, s, offs),
       2 * rows * d * n)):
    for cfg in schedules.INSTANTIATED[kind]:
      cargs = args
      if cfg in schedules.SWIGLU_IN_ORDER_CONFIGS:  # the gathered copy, read in order by TMA
        cargs = (ops.gather_rows(x, idx, offs), None, *args[2:])
      ms, timer, _ = gpu_ms(jax.jit(lambda *a, c=int(cfg), f=f: f(*a, config=c)), *cargs,
                            iters=iters)
      out.append(dict(kind="fused_epilogue_kernel", name=name, config=cfg.name, ffi_ms=ms,
                      ffi_tflops=flops / ms / 1e9, timer=timer))
      print(f"  {name:14s} [{cfg.name:22s}] {ms:8.3f} ms {flops / ms / 1e9:5.0f} TF/s", flush=True)
  return out, {}


def run_elementwise(t, d, n, e, k, iters):
  """dSwiGLU (block / warp per row) and SwiGLU-from-H on the config's P = T·K rows: ms, GB/s on
  the bytes each moves, and a copy of the dSwiGLU's bytes (read + write) for the ceiling."""
  del d
  ks = jax.random.split(jax.random.key(0), 4)
  plan = route_logits(jax.random.normal(ks[0], (t, e), jnp.float32), top_k=k)
  p = plan.capacity
  da = jax.random.normal(ks[1], (p, n), jnp.float32)
  h = jax.random.normal(ks[2], (p, 2 * n), jnp.bfloat16)
  s = jax.random.uniform(ks[3], (p,), jnp.float32, 0.1, 1.0)
  offs = plan.group_offsets
  dswiglu_bytes = p * (4 * n + 2 * 2 * n + 4) + p * (2 * 2 * n + 2 * n + 4)
  out, ref = [], None
  for variant in ("block", "warp"):
    f = jax.jit(lambda da, h, s, o, w=variant == "warp": ops.dswiglu(da, h, s, o,
                                                                     warp_per_row=w))
    ms, timer, res = gpu_ms(f, da, h, s, offs, iters=iters)
    ref = res if ref is None else ref
    err = max(_rel(a, b) for a, b in zip(res, ref))
    gbs = dswiglu_bytes / ms / 1e6
    out.append(dict(kind="elementwise", name=f"dswiglu_{variant}", n=n, rows=p, ms=ms,
                    gbps=gbs, rel_vs_block=err, timer=timer))
    print(f"  dswiglu {variant:5s} P={p} n={n}  {ms:7.3f} ms  {gbs:6.0f} GB/s  "
          f"rel vs block {err:.1e}", flush=True)
  f = jax.jit(lambda h, o: ops.swiglu_from_h(h, o))
  ms, timer, _ = gpu_ms(f, h, offs, iters=iters)
  gbs = p * (2 * 2 * n + 2 * n) / ms / 1e6
  out.append(dict(kind="elementwise", name="swiglu_from_h", n=n, rows=p, ms=ms, gbps=gbs,
                  timer=timer))
  print(f"  swiglu_from_h P={p} n={n}  {ms:7.3f} ms  {gbs:6.0f} GB/s", flush=True)
  src = jax.random.normal(ks[1], (dswiglu_bytes // 8,), jnp.float32)
  ms, timer, _ = gpu_ms(jax.jit(lambda a: a * 2.0), src, iters=iters)
  gbs = dswiglu_bytes / ms / 1e6
  out.append(dict(kind="elementwise", name="copy", bytes=dswiglu_bytes, ms=ms, gbps=gbs,
                  timer=timer))
  print(f"  copy of the dswiglu bytes  {ms:7.3f} ms  {gbs:6.0f} GB/s", flush=True)
  return out, {}


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m sonic_jax.ffi.sweep", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--configs", nargs="+", default=["32768,4096,1024,128,8"])
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--json", default=None)
  ap.add_argument("--layer-only", action="store_true",
                  help="only the layer timings with the current schedules table")
  ap.add_argument("--fused-gather-only", action="store_true",
                  help="only the fused-gather GEMMs vs gather_rows + GEMM, and the layer with "
                       "and without FfiKernels(fused_gather=True)")
  ap.add_argument("--fused-epilogue-only", action="store_true",
                  help="only up_proj, dh and the layer with the SwiGLU / dSwiGLU epilogues "
                       "separate and fused (FfiKernels(fused_epilogue=...))")
  ap.add_argument("--gemms-only", action="store_true",
                  help="only the plain grouped GEMMs under every schedule and the layer with the "
                       "default and the swept schedules table")
  ap.add_argument("--only-schedules", nargs="+", default=None, metavar="CONFIG",
                  choices=[c.name for c in schedules.GemmConfig],
                  help="with --gemms-only: time only these GemmConfig names, next to each "
                       "kind's default (kinds that build none of them are skipped)")
  ap.add_argument("--elementwise-only", action="store_true",
                  help="only the dSwiGLU (block / warp per row) and SwiGLU kernels, with their "
                       "bandwidth")
  ap.add_argument("--epilogue-variants", nargs="+", choices=list(EPILOGUE_VARIANTS)[1:],
                  default=None, help="with --fused-epilogue-only: the fused variants to time "
                                     "besides 'separate' (default: all)")
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  report = dict(device=dev.device_kind, jax=jax.__version__, iters=args.iters, results=[])
  for cfg in args.configs:
    t, d, n, e, k = map(int, cfg.split(","))
    print(f"config T={t} d={d} n={n} E={e} K={k} on {dev.device_kind}", flush=True)
    if args.elementwise_only:
      rows, picks = run_elementwise(t, d, n, e, k, args.iters)
    elif args.fused_epilogue_only:
      rows, picks = run_fused_epilogue(t, d, n, e, k, args.iters, args.epilogue_variants)
    else:
      rows, picks = run_config(t, d, n, e, k, args.iters, sweep=not args.layer_only,
                               fused_only=args.fused_gather_only,
                               gemms_only=args.gemms_only, only=args.only_schedules)
    report["results"].append(dict(config=dict(T=t, d=d, n=n, E=e, K=k), rows=rows,
                                  picks=picks))
    if args.json:  # after every config, so a timeout keeps what finished
      with open(args.json, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
