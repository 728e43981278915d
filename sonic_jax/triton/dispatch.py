"""Row dispatch: token rows x (T, d) -> grouped rows (P, d), out[p] = x[gather_idx[p]].

What XLA does as ``x[plan.gather_idx]`` (the backward's gathered x for dW1 and gathered dO for dh
and dW2 when they are not gathered inside the kernels), as one Triton kernel:

* ``method="scatter"`` (top-K plans): one program reads block_t whole token rows once, in order,
  and writes each to the token's K grouped rows ``reverse_idx[t·K + k]``. A gather reads x rows in
  grouped order instead, i.e. every x row K times at random, which at T·d ≫ L2 comes from HBM
  each time: the scatter moves (P + T)·d elements instead of 2·P·d.
* ``method="gather"``: out[p] = x[gather_idx[p]], grouped rows written in order (any plan; token
  rounding's padding rows get x[0], as XLA's gather gives them). A plan without a fixed K (token
  rounding) always takes this path.

Each thread moves contiguous columns (16-byte vectors for bf16), no atomics, every output row
written once (the scatter's rows form a permutation of P = T·K).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from sonic_jax import triton as tri
from sonic_jax.routing import RoutingPlan


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
  """method: "scatter" (top-K plans; others use "gather") or "gather". block_t: token rows
  ("scatter") or grouped rows ("gather") per program; block_d: columns per program (None: the
  largest power of two <= 2048 dividing d); both powers of two."""

  method: Literal["scatter", "gather"] = "scatter"
  block_t: int = 1
  block_d: int | None = None
  num_warps: int = 4

  def __post_init__(self):
    if self.method not in ("scatter", "gather"):
      raise ValueError(f"DispatchConfig.method must be 'scatter' or 'gather', got "
                       f"{self.method!r}")
    for name in ("block_t", "block_d"):
      v = getattr(self, name)
      if v is not None and (not isinstance(v, int) or v < 1 or v & (v - 1)):
        raise ValueError(f"DispatchConfig.{name} must be a power of two, got {v!r}")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"DispatchConfig.num_warps must be 1, 2, 4, 8 or 16, got "
                       f"{self.num_warps}")


def _block_d(d: int, config: DispatchConfig) -> int:
  return tri.column_block(d, config.block_d, largest=2048, arg="x.shape[1]",
                          config_name="DispatchConfig", kernel="dispatch")


def validate_dispatch(x, plan: RoutingPlan) -> None:
  if not isinstance(plan, RoutingPlan):
    raise ValueError(f"plan must be a sonic_jax.RoutingPlan, got {type(plan).__name__}")
  if getattr(x, "ndim", None) != 2 or x.shape[0] != plan.num_tokens:
    raise ValueError(f"x must have shape (T, d) with T = plan.num_tokens = {plan.num_tokens}, "
                     f"got {jnp.shape(x)}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must be floating point, got dtype {x.dtype}")


def dispatch(x: jax.Array, plan: RoutingPlan, *, impl: str = "jax_triton",
             config: DispatchConfig | None = None, interpret: bool = False) -> jax.Array:
  """x (T, d) -> (P, d) in x.dtype, row p = x[plan.gather_idx[p]] (see the module doc)."""
  validate_dispatch(x, plan)
  tri.validate_impl(impl)
  config = config or DispatchConfig()
  num_tokens, d = x.shape
  block_d = _block_d(d, config)
  tri.check_available(impl, interpret)
  num_rows = plan.capacity
  # The scatter writes every grouped row once: a top-K plan's P = T·K rows, all live.
  scatter = config.method == "scatter" and plan.fixed_top_k is not None
  if impl == "pallas_triton":
    from sonic_jax.triton import pallas_kernels as pk
    if scatter:
      call = pk.dispatch_scatter_call(num_tokens, d, plan.top_k, x.dtype, config.block_t,
                                      block_d, config.num_warps, bool(interpret))
      return tri.sequential(call)(
          plan.reverse_idx.astype(jnp.int32).reshape(num_tokens, plan.top_k), x)
    call = pk.dispatch_gather_call(num_rows, d, x.dtype, config.block_t, block_d,
                                   config.num_warps, bool(interpret))
    return tri.sequential(call)(plan.gather_idx.astype(jnp.int32), x)
  from sonic_jax.triton import _jt_kernels as jk
  out_shape = jax.ShapeDtypeStruct((num_rows, d), x.dtype)
  if scatter:
    return tri.jax_triton_call(
        x, plan.reverse_idx.astype(jnp.int32), scalars=(num_tokens,),
        kernel=jk.dispatch_scatter_kernel, out_shape=out_shape,
        grid=(-(-num_tokens // config.block_t), d // block_d), num_warps=config.num_warps,
        num_stages=1, D=d, K=plan.top_k, BLOCK_T=config.block_t, BLOCK_D=block_d)
  return tri.jax_triton_call(
      x, plan.gather_idx.astype(jnp.int32), scalars=(num_rows,),
      kernel=jk.dispatch_gather_kernel, out_shape=out_shape,
      grid=(-(-num_rows // config.block_t), d // block_d), num_warps=config.num_warps,
      num_stages=1, D=d, BLOCK_R=config.block_t, BLOCK_D=block_d)


__all__ = ["DispatchConfig", "dispatch", "validate_dispatch"]
