"""Runs the ffi weight-gradient GEMMs of one layer shape, for a profiler to look at.

  python benchmarks/wgrad_kernels.py --config T,d,n,E,K [--iters 3] [--variants gather,plain]

dW1 = x[idx]ᵀ · dH and dW2 = A'ᵀ · dO[idx] for a top-K routing of random logits, random bf16
data: ``gather`` runs the gathered varlen-K kernel (kind 10, ops.gathered_varlen_k, its default
schedule: schedules.IN_ORDER_WGRAD), ``tile128x256`` / ``tile256x128`` the same with the TMA
schedule on that tile (GATHER_TMA_B_128x256_C2x1 / GATHER_TMA_256x128_C2x1), ``nocluster``
the 256 x 128 one without the 2-CTA cluster (GATHER_TMA_256x128_C1), ``plain``
CUTLASS's varlen-K GEMM on rows gathered beforehand (what the default backward runs),
``inorder`` kind 10 on those pre-gathered rows (no index: is the gather or the kernel slow?),
``coop`` kind 10 with both operands by cp.async (GATHER_COOP_128x256) and the index. Each is
compiled, checked against the other (relative error printed) and called --iters times, so that
e.g. ``ncu -k regex:gather_wgrad --launch-skip 2 --launch-count 2`` profiles warm launches.
Prints the CUPTI median per variant as well (sonic_jax.bench.timing).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.bench.timing import compile_and_time
from sonic_jax.ffi import ops
from sonic_jax.ffi.ops import GemmConfig, GemmKind
from sonic_jax.routing import route_logits


def _rel(a: jax.Array, b: jax.Array) -> float:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--config", default="32768,4096,256,256,16", help="T,d,n,E,K")
  ap.add_argument("--iters", type=int, default=3)
  ap.add_argument("--variants", default="gather,plain")
  ap.add_argument("--time", action="store_true", help="also print CUPTI medians (10 runs)")
  args = ap.parse_args()
  t, d, n, e, k = (int(v) for v in args.config.split(","))
  ks = jax.random.split(jax.random.key(0), 6)
  plan = route_logits(jax.random.normal(ks[0], (t, e), jnp.float32), top_k=k)
  idx, offs = plan.gather_idx, plan.group_offsets
  rows = idx.shape[0]
  bf = jnp.bfloat16
  x = jax.random.normal(ks[1], (t, d), bf)
  dout = jax.random.normal(ks[2], (t, d), bf)
  dh = jax.random.normal(ks[3], (rows, 2 * n), bf)
  a_prime = jax.random.normal(ks[4], (rows, n), bf)

  tma_b, coop = GemmConfig.GATHER_TMA_B_128x256_C2x1, GemmConfig.GATHER_COOP_128x256

  def gathered(config):
    return {
        "dw1": jax.jit(lambda x, i, g, o: ops.gathered_varlen_k(x, i, g, None, o, config=config)),
        "dw2": jax.jit(lambda a, g, i, o: ops.gathered_varlen_k(a, None, g, i, o, config=config)),
    }

  fns = {
      "gather": gathered(None),
      "tile128x256": gathered(tma_b),
      "tile256x128": gathered(GemmConfig.GATHER_TMA_256x128_C2x1),
      "nocluster": gathered(GemmConfig.GATHER_TMA_256x128_C1),
      "plain": {
          "dw1": jax.jit(lambda x, i, g, o: ops.grouped_gemm(
              ops.gather_rows(x, i, o), g, o, GemmKind.VARLEN_K_BF16)),
          "dw2": jax.jit(lambda a, g, i, o: ops.grouped_gemm(
              a, ops.gather_rows(g, i, o), o, GemmKind.VARLEN_K_BF16)),
      },
      "inorder": {
          "dw1": jax.jit(lambda x, i, g, o: ops.gathered_varlen_k(
              ops.gather_rows(x, i, o), None, g, None, o, config=tma_b)),
          "dw2": jax.jit(lambda a, g, i, o: ops.gathered_varlen_k(
              a, None, ops.gather_rows(g, i, o), None, o, config=tma_b)),
      },
      "coop": gathered(coop),
  }
  operands = {"dw1": (x, idx, dh, offs), "dw2": (a_prime, dout, idx, offs)}
  out = {}
  for which in ("dw1", "dw2"):
    for variant in args.variants.split(","):
      f = fns[variant][which]
      for _ in range(args.iters):
        res = f(*operands[which])
      out[variant, which] = jax.block_until_ready(res)
      if args.time:
        ms = compile_and_time(f, operands[which], iters=10).timing.median_ms
        print(f"{which} {variant}: {ms:.3f} ms", flush=True)
    if ("plain", which) in out:
      for variant in args.variants.split(","):
        if variant != "plain":
          rel = _rel(out[variant, which], out["plain", which])
          print(f"{which}: rel({variant}, plain) = {rel:.2e}", flush=True)


if __name__ == "__main__":
  main()
