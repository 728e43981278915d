"""One ffi grouped GEMM per schedule, for Nsight Compute (GPU).

  ncu --clock-control none -k regex:'gather_gemm|device_kernel' python benchmarks/ncu_gemm.py \
      --kind VARLEN_M_NN_BF16 --shape 262144,512,4096,128 --configs COOPERATIVE_128x256_C1x1 ...

Random bf16 operands and expert row counts from top-K routing of random logits (T = P / 8,
K = 8, ``sonic_jax.routing.route_logits`` as in the sweep); each schedule runs six times (compile
and warm-up, then five), so `-c 1` profiles its first launch and `--launch-skip` /
`--launch-count` others. Prints the mean wall time of the five as a sanity check; the timings
that count come from ncu or the sweep (`python -m sonic_jax.ffi.sweep`).

``--kind VARLEN_M_GATHER_SWIGLU`` runs ``ops.up_proj_swiglu`` on the rows in order (N = 2n,
W1's columns; configs of ``schedules.SWIGLU_IN_ORDER_CONFIGS``), to set the SwiGLU epilogue
against the plain one of the same schedule (``--kind VARLEN_M_NN_BF16``, same shape).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from sonic_jax.ffi import ops
from sonic_jax.ffi.schedules import GemmKind
from sonic_jax.routing import route_logits

TOP_K = 8


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--kind", required=True,
                  help="a plain varlen-M GemmKind name, or VARLEN_M_GATHER_SWIGLU")
  ap.add_argument("--shape", required=True, help="P,K,N,E: rows, contraction, columns, experts")
  ap.add_argument("--configs", nargs="+", required=True, help="GemmConfig names")
  args = ap.parse_args()
  kind = GemmKind[args.kind]
  p, k, n, e = (int(v) for v in args.shape.split(","))
  kr, ka, kb = jax.random.split(jax.random.key(0), 3)
  offs = route_logits(jax.random.normal(kr, (p // TOP_K, e), jnp.float32),
                      top_k=TOP_K).group_offsets
  a = jax.random.normal(ka, (p, k), jnp.bfloat16)
  nt = kind.name.startswith("VARLEN_M_NT")
  b = jax.random.normal(kb, (e, n, k) if nt else (e, k, n), jnp.bfloat16) * 0.05
  for name in args.configs:
    if kind == GemmKind.VARLEN_M_GATHER_SWIGLU:  # (H, A) from the rows in order
      f = jax.jit(lambda a, b, o, c=ops.GemmConfig[name]: ops.up_proj_swiglu(a, None, b, o,
                                                                              config=c)[1])
    else:
      f = jax.jit(lambda a, b, o, c=ops.GemmConfig[name]: ops.grouped_gemm(a, b, o, kind,
                                                                            config=c))
    f(a, b, offs).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(5):
      out = f(a, b, offs)
    out.block_until_ready()
    ms = (time.perf_counter() - t0) / 5 * 1e3
    print(f"{kind.name} {name}: {ms:.3f} ms wall (mean of 5), finite={bool(jnp.isfinite(out).all())}",
          flush=True)


if __name__ == "__main__":
  main()
