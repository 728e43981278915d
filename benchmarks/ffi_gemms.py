"""Times the ffi backend's grouped GEMMs against an XLA dense matmul of the same total shape.

  python benchmarks/ffi_gemms.py [--configs T,d,n,E,K ...] [--iters 20] [--json out.json]

For each config: top-K routing from random logits, random bf16 data; each of the six grouped
GEMMs alone (gathers done beforehand) vs jnp.dot over the same (rows, K) x (K, N) total shape,
then the full entry points (with gathers / epilogues) and the layer forward and forward+backward
(18·T·K·d·n FLOPs, the paper's count). GPU-side time: CUPTI kernel time through
jax.experimental.mosaic.gpu.profiler.measure (sonic_jax.bench.timing), median over --iters runs
after a warm-up; each row's ``timer`` says "cupti" or "wall" (the fallback).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import sonic_jax
from sonic_jax.bench.timing import compile_and_time
from sonic_jax.ffi import ops
from sonic_jax.ffi.backend import FfiKernels
from sonic_jax.ffi.ops import GemmKind
from sonic_jax.routing import route_logits


def gpu_ms(f, *args, iters: int) -> tuple[float, str]:
  """Median GPU time of f(*args) in ms (CUPTI kernel time; wall clock if CUPTI fails), timer."""
  t = compile_and_time(f, args, iters=iters).timing  # compile + one call, then timed
  if t.note:
    print(f"  ({t.note})", file=sys.stderr)
  return t.median_ms, t.timer


def run_config(t, d, n, e, k, iters):
  ks = jax.random.split(jax.random.key(0), 8)
  logits = jax.random.normal(ks[0], (t, e), jnp.float32)
  plan = route_logits(logits, top_k=k)
  rows = int(plan.group_offsets[-1])
  bf = jnp.bfloat16
  x = jax.random.normal(ks[1], (t, d), bf)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n)) / np.sqrt(d)).astype(bf)
  w2 = (jax.random.normal(ks[3], (e, n, d)) / np.sqrt(n)).astype(bf)
  dout = jax.random.normal(ks[4], (t, d), bf)
  offs = plan.group_offsets
  xg = x[plan.gather_idx]
  dog = dout[plan.gather_idx]
  a = jax.random.normal(ks[5], (rows, n), bf)
  dh = jax.random.normal(ks[6], (rows, 2 * n), bf)
  f32 = jnp.float32

  def dense(lhs_t: bool, out_dtype):
    if lhs_t:  # (P, M)ᵀ · (P, N)
      return jax.jit(lambda l, r: jax.lax.dot_general(
          l, r, (((0,), (0,)), ((), ())), preferred_element_type=out_dtype))
    return jax.jit(lambda l, r: jnp.dot(l, r, preferred_element_type=out_dtype))

  gg = lambda kind: jax.jit(lambda l, r, o: ops.grouped_gemm(l, r, o, kind))
  # name, ffi fn + args, dense fn + args, flops
  cases = [
      ("up_proj x·W1", gg(GemmKind.VARLEN_M_NN_F32), (xg, w1, offs),
       dense(False, f32), (xg, w1[0]), 2 * rows * d * 2 * n),
      ("down_proj A·W2", gg(GemmKind.VARLEN_M_NN_BF16), (a, w2, offs),
       dense(False, bf), (a, w2[0]), 2 * rows * n * d),
      ("dh dO·W2ᵀ", gg(GemmKind.VARLEN_M_NT_F32), (dog, w2, offs),
       dense(False, f32), (dog, w2[0].T), 2 * rows * d * n),
      ("dx_pairs dH·W1ᵀ", gg(GemmKind.VARLEN_M_NT_BF16), (dh, w1, offs),
       dense(False, bf), (dh, w1[0].T), 2 * rows * 2 * n * d),
      ("dw1 Xgᵀ·dH", gg(GemmKind.VARLEN_K_F32), (xg, dh, offs),
       dense(True, f32), (xg[:rows], dh), 2 * rows * d * 2 * n),
      ("dw2 A'ᵀ·dOg", gg(GemmKind.VARLEN_K_F32), (a, dog, offs),
       dense(True, f32), (a, dog[:rows]), 2 * rows * n * d),
  ]
  out = []
  for name, f, args, fd, dargs, flops in cases:
    ms, how = gpu_ms(f, *args, iters=iters)
    ms_d, _ = gpu_ms(fd, *dargs, iters=iters)
    out.append(dict(kind="gemm", name=name, ffi_ms=ms, dense_ms=ms_d,
                    ffi_tflops=flops / ms / 1e9, dense_tflops=flops / ms_d / 1e9,
                    ratio=ms_d / ms, timer=how))
    print(f"  {name:18s} ffi {ms:8.3f} ms {flops / ms / 1e9:6.0f} TF/s | dense {ms_d:8.3f} ms "
          f"{flops / ms_d / 1e9:6.0f} TF/s | ratio {ms_d / ms:.2f}", flush=True)

  kern = FfiKernels()
  s = plan.grouped_scores()
  h, _ = jax.jit(kern.up_proj)(x, w1, plan)
  entries = [
      ("entry up_proj", jax.jit(kern.up_proj), (x, w1, plan), 2 * rows * d * 2 * n),
      ("entry dh", jax.jit(kern.dh), (dout, w2, h, s, plan), 2 * rows * d * n),
      ("entry dw1", jax.jit(kern.dw1), (x, dh, plan), 2 * rows * d * 2 * n),
  ]
  router_w = (jax.random.normal(ks[7], (d, e)) / np.sqrt(d)).astype(bf)
  fwd = jax.jit(lambda x, r, w1, w2: sonic_jax.moe(x, r, w1, w2, top_k=k, backend="ffi"))
  fb = jax.jit(jax.grad(lambda x, r, w1, w2: jnp.sum(
      sonic_jax.moe(x, r, w1, w2, top_k=k, backend="ffi").astype(f32)), argnums=(0, 1, 2, 3)))
  entries += [("layer fwd", fwd, (x, router_w, w1, w2), 6 * t * k * d * n),
              ("layer fwd+bwd", fb, (x, router_w, w1, w2), 18 * t * k * d * n)]
  for name, f, args, flops in entries:
    ms, how = gpu_ms(f, *args, iters=iters)
    out.append(dict(kind="entry", name=name, ffi_ms=ms, ffi_tflops=flops / ms / 1e9, timer=how))
    print(f"  {name:18s} ffi {ms:8.3f} ms {flops / ms / 1e9:6.0f} TF/s", flush=True)
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--configs", nargs="+", default=["32768,4096,1024,128,8"])
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  dev = jax.devices()[0]
  report = dict(device=dev.device_kind, jax=jax.__version__, results=[])
  for cfg in args.configs:
    t, d, n, e, k = map(int, cfg.split(","))
    print(f"config T={t} d={d} n={n} E={e} K={k} on {dev.device_kind}", flush=True)
    report["results"].append(dict(config=dict(T=t, d=d, n=n, E=e, K=k),
                                  rows=run_config(t, d, n, e, k, args.iters)))
    if args.json:  # after every config, so a timeout keeps what finished
      with open(args.json, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
