"""Per-token gather-and-sum: out[t] = Σ_k s_tk · Y[reverse_idx[t·K + k]] in fp32 (the contract's
``combine``; ``scores=None`` is the unweighted dx sum).

One program owns block_t tokens x block_d columns and loops over the K pairs (unrolled, so all
K row loads are in flight at once); each thread reads contiguous columns, 16-byte vectors for
bf16. Every output element is written once, no atomics. Top-K plans only: a plan with a variable
pair count per token (token rounding) is summed by XLA's segment_sum, as in the xla backend.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sonic_jax import triton as tri
from sonic_jax.routing import RoutingPlan

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class CombineConfig:
  """block_t tokens x block_d columns per program (powers of two; block_d None: the largest
  power of two <= 1024 dividing d)."""

  block_t: int = 4
  block_d: int | None = None
  num_warps: int = 4

  def __post_init__(self):
    for name in ("block_t", "block_d"):
      v = getattr(self, name)
      if v is not None and (v < 1 or v & (v - 1)):
        raise ValueError(f"CombineConfig.{name} must be a power of two, got {v}")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"CombineConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


def block_d_for(d: int, config: CombineConfig) -> int:
  return tri.column_block(d, config.block_d, largest=1024, arg="y.shape[1]",
                          config_name="CombineConfig", kernel="combine")


def validate_combine(y, plan: RoutingPlan, scores) -> None:
  if not isinstance(plan, RoutingPlan):
    raise ValueError(f"plan must be a sonic_jax.RoutingPlan, got {type(plan).__name__}")
  if getattr(y, "ndim", None) != 2 or y.shape[0] != plan.capacity:
    raise ValueError(f"y must have shape (P, d) with P = plan capacity {plan.capacity}, got "
                     f"{jnp.shape(y)}")
  if not jnp.issubdtype(y.dtype, jnp.floating):
    raise ValueError(f"y must be floating point, got dtype {y.dtype}")
  if scores is not None and getattr(scores, "shape", None) != (plan.capacity,):
    raise ValueError(f"scores must have shape ({plan.capacity},) or be None, got "
                     f"{jnp.shape(scores)}")


def combine(y: jax.Array, plan: RoutingPlan, scores: jax.Array | None, out_dtype, *,
            impl: str = "jax_triton", config: CombineConfig | None = None,
            interpret: bool = False) -> jax.Array:
  """y (P, d) grouped rows -> (T, d) in out_dtype; scores (P,) fp32 in flat order or None."""
  validate_combine(y, plan, scores)
  tri.validate_impl(impl)
  config = config or CombineConfig()
  num_tokens, d = plan.num_tokens, y.shape[1]
  block_d = block_d_for(d, config)
  out_dtype = jnp.dtype(out_dtype)
  if plan.top_k is None:
    rows = y[plan.reverse_idx].astype(_F32)
    if scores is not None:
      rows = rows * scores.astype(_F32)[:, None]
    rows = jnp.where(plan.valid_mask()[:, None], rows, 0.0)
    return jax.ops.segment_sum(rows, plan.token_ids, num_segments=num_tokens,
                               indices_are_sorted=True).astype(out_dtype)
  tri.check_available(impl, interpret)
  k = plan.top_k
  rev = plan.reverse_idx.astype(jnp.int32)
  weighted = scores is not None
  s = scores.astype(_F32) if weighted else None
  if impl == "pallas_triton":
    from sonic_jax.triton import pallas_kernels as pk
    call = pk.combine_call(num_tokens, y.shape[0], d, k, weighted, y.dtype, out_dtype,
                           config.block_t, block_d, config.num_warps, bool(interpret))
    args = (rev.reshape(num_tokens, k),) + ((s.reshape(num_tokens, k),) if weighted else ())
    return tri.sequential(call)(*args, y)
  from sonic_jax.triton import _jt_kernels as jk
  grid = (-(-num_tokens // config.block_t), d // block_d)
  s_arg = s if weighted else jnp.zeros((1,), _F32)
  return tri.jax_triton_call(
      y, rev, s_arg, scalars=(num_tokens,), kernel=jk.combine_kernel,
      out_shape=jax.ShapeDtypeStruct((num_tokens, d), out_dtype), grid=grid,
      num_warps=config.num_warps, num_stages=1, D=d, K=k, WEIGHTED=weighted,
      BLOCK_T=config.block_t, BLOCK_D=block_d)


__all__ = ["CombineConfig", "combine", "validate_combine", "block_d_for"]
