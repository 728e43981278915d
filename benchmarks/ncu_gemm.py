"""One ffi grouped GEMM per schedule, for Nsight Compute (GPU).

  ncu --clock-control none -k regex:'gather_gemm|device_kernel' python benchmarks/ncu_gemm.py \
      --kind VARLEN_M_NN_BF16 --shape 262144,512,4096,128 --configs COOPERATIVE_128x256_C1x1 ...

Random bf16 operands and expert row counts from top-K routing of random logits (T = P / 8,
K = 8); each schedule runs twice (compile + one more call), so `--launch-skip` / `--launch-count`
pick the calls to profile. Prints each schedule's wall time of 5 calls as a sanity check; the
timings that count come from ncu or the sweep (`python -m sonic_jax.ffi.sweep`).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.ffi import ops
from sonic_jax.ffi.schedules import GemmKind


def group_offsets(rows: int, num_groups: int, top_k: int = 8, seed: int = 0) -> np.ndarray:
  """(E + 1,) int32 offsets of `rows` expert rows from top-K routing of random logits."""
  rng = np.random.default_rng(seed)
  logits = rng.standard_normal((rows // top_k, num_groups), dtype=np.float32)
  top = np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]
  counts = np.bincount(top.ravel(), minlength=num_groups)
  return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--kind", required=True, help="a plain varlen-M GemmKind name")
  ap.add_argument("--shape", required=True, help="P,K,N,E: rows, contraction, columns, experts")
  ap.add_argument("--configs", nargs="+", required=True, help="GemmConfig names")
  args = ap.parse_args()
  kind = GemmKind[args.kind]
  p, k, n, e = (int(v) for v in args.shape.split(","))
  offs = jnp.asarray(group_offsets(p, e))
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (p, k), jnp.bfloat16)
  nt = kind.name.startswith("VARLEN_M_NT")
  b = jax.random.normal(kb, (e, n, k) if nt else (e, k, n), jnp.bfloat16) * 0.05
  for name in args.configs:
    f = jax.jit(lambda a, b, o, c=ops.GemmConfig[name]: ops.grouped_gemm(a, b, o, kind, config=c))
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
