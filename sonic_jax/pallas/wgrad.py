"""Expert weight gradients dW1, dW2 as Pallas Mosaic GPU varlen-K grouped GEMMs, Hopper.

  dW1[e] = Σ_{p in e} x[gather_idx[p]]ᵀ ⊗ dH[p]    -> (E, d, 2n)
  dW2[e] = Σ_{p in e} A'[p]ᵀ ⊗ dO[gather_idx[p]]   -> (E, n, d)

Both are ``out[e] = lhs[rows of e]ᵀ · rhs[rows of e]`` with the reduction (K) running over the
expert's grouped rows. A persistent grid walks (expert, M tile, N tile); each output tile
pipelines the expert's K blocks with TMA and accumulates with wgmma (lhs tile transposed in
SMEM). K blocks are aligned to block_k, so an expert's first and last block can hold rows of a
neighbour (or padding rows, which may be NaN): those two blocks are masked in registers with a
select (not a multiply, so NaN never leaks) and written back to SMEM before the wgmma. Every
output tile is written once by one CTA: deterministic, no atomics; empty experts give zeros.

The row gather (x or dO by gather_idx) is an XLA gather feeding the kernel (first fast path).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sonic_jax.pallas.dh import _num_sms, interpret_params
from sonic_jax.routing import RoutingPlan

_OPERAND_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class WgradConfig:
  """Static tiling of the varlen-K weight-gradient kernel.

  block_m, block_n: output tile (rows of the lhs feature dim, columns of the rhs feature dim).
  block_k: grouped rows per pipeline step. max_concurrent_steps: TMA pipeline depth.
  grid_block_n: planar-snake width over the (M, N) tiles of one expert.
  out_dtype: None = the operand dtype (the custom_vjp casts to the weight dtype anyway), or
  float32. num_sms: persistent CTAs; None = the device's SM count (2 in interpret mode).
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 1
  out_dtype: str | None = None
  num_sms: int | None = None

  def __post_init__(self):
    for f in ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n"):
      v = getattr(self, f)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"WgradConfig.{f} must be a positive int, got {v!r}")
    if self.block_m % 64:
      raise ValueError(f"WgradConfig.block_m must be a multiple of 64, got {self.block_m}")
    if self.out_dtype not in (None, "float32"):
      raise ValueError(f"WgradConfig.out_dtype must be None or 'float32', got {self.out_dtype!r}")


def wgrad_config_for(m: int, n: int) -> WgradConfig:
  """Default tiling for an (E, m, n) output: 128-wide tiles where the shape allows, else 64;
  5 stages and a planar-snake width of 4 (dW1 at T=32768, d=4096, n=1024, E=128, K=8 on H200:
  6.52 ms against 6.76 ms with 4 stages and width 1)."""
  return WgradConfig(block_m=128 if m % 128 == 0 else 64, block_n=128 if n % 128 == 0 else 64,
                     max_concurrent_steps=5, grid_block_n=4)


def _validate(lhs, rhs, plan: RoutingPlan, config: WgradConfig, names) -> None:
  ln, rn = names
  p = plan.capacity
  for name, a in ((ln, lhs), (rn, rhs)):
    if getattr(a, "ndim", None) != 2 or a.shape[0] != p:
      raise ValueError(f"{name} must have shape (P, ·) with P = {p} rows, got {jnp.shape(a)}")
    if jnp.dtype(a.dtype) not in _OPERAND_DTYPES:
      raise ValueError(f"{name} must be bfloat16 or float16, got {a.dtype}")
  if lhs.dtype != rhs.dtype:
    raise ValueError(f"{ln} and {rn} must share a dtype, got {lhs.dtype} and {rhs.dtype}")
  validate_wgrad_shapes(lhs.shape[1], rhs.shape[1], config, names)


def validate_wgrad_shapes(m: int, n: int, config: WgradConfig, names=("lhs", "rhs")) -> None:
  """Raises ValueError when an (E, m, n) output cannot be tiled by ``config``; ``names`` name
  the (P, m) and (P, n) operands."""
  ln, rn = names
  if m % config.block_m:
    raise ValueError(f"{ln}.shape[1] ({m}) must be a multiple of WgradConfig.block_m "
                     f"({config.block_m})")
  if n % config.block_n:
    raise ValueError(f"{rn}.shape[1] ({n}) must be a multiple of WgradConfig.block_n "
                     f"({config.block_n})")


def grouped_outer(lhs: jax.Array, rhs: jax.Array, plan: RoutingPlan, *,
                  config: WgradConfig | None = None, interpret=False) -> jax.Array:
  """out[e] = Σ_{p in group e} lhs[p]ᵀ ⊗ rhs[p]: lhs (P, M), rhs (P, N) -> (E, M, N)."""
  config = config or wgrad_config_for(lhs.shape[-1], rhs.shape[-1])
  _validate(lhs, rhs, plan, config, ("lhs", "rhs"))
  p_rows, m = lhs.shape
  n = rhs.shape[1]
  g = plan.num_experts
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  out_dtype = jnp.float32 if config.out_dtype == "float32" else lhs.dtype
  starts = plan.group_offsets[:-1]
  ends = plan.group_offsets[1:]
  block_starts = (starts // bk) * bk
  num_blocks = jnp.where(ends > starts, (ends + bk - 1) // bk - starts // bk, 0)
  grid_m, grid_n = m // bm, n // bn
  delay = 1 if config.max_concurrent_steps > 1 else 0

  def body(meta_gmem, lhs_gmem, rhs_gmem, o_gmem):
    @plgpu.nd_loop((g, grid_m * grid_n), collective_axes="sm")
    def _(loop_info: plgpu.NDLoopInfo):
      gi = loop_info.index[0]
      mi, ni = plgpu.planar_snake(loop_info.index[1], (grid_m, grid_n), 1, config.grid_block_n)
      start, end = meta_gmem[0, gi], meta_gmem[1, gi]
      block_start = pl.multiple_of(meta_gmem[2, gi], bk)
      nblocks = meta_gmem[3, gi]

      def acc_scope(acc_ref):
        def step(idx, lhs_smem, rhs_smem):
          k = idx[0]

          @pl.when((k == 0) | (k == nblocks - 1))
          def _():
            # Boundary blocks: zero rows outside [start, end) with a select, so neighbour
            # rows vanish and padding garbage (even NaN) never reaches the accumulator.
            row0 = block_start + k * bk
            for ref, cols in ((lhs_smem, bm), (rhs_smem, bn)):
              r = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (bk, cols), 0),
                                    plgpu.Layout.WGMMA) + row0
              keep = (r >= start) & (r < end)
              v = ref[...]
              ref[...] = jnp.where(keep, v, jnp.zeros_like(v))
            plgpu.commit_smem()

          plgpu.wgmma(acc_ref, lhs_smem.T, rhs_smem)
          if not delay:
            plgpu.wgmma_wait(0)

        @pl.when(nblocks > 0)
        def _():
          plgpu.emit_pipeline(
              step,
              grid=(nblocks,),
              in_specs=[
                  plgpu.BlockSpec((bk, bm), lambda k: (k, mi), delay_release=delay),
                  plgpu.BlockSpec((bk, bn), lambda k: (k, ni), delay_release=delay),
              ],
              max_concurrent_steps=config.max_concurrent_steps,
          )(lhs_gmem.at[pl.ds(block_start, p_rows)], rhs_gmem.at[pl.ds(block_start, p_rows)])

        return acc_ref[...]

      acc = pl.run_scoped(acc_scope, plgpu.ACC((bm, bn)))
      # An empty expert skips the pipeline: its accumulator keeps its zero initialization.

      @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((bm, bn), out_dtype))
      def _(o_smem):
        o_smem[...] = acc.astype(out_dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[gi, pl.ds(mi * bm, bm), pl.ds(ni * bn, bn)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((g, m, n), out_dtype),
      grid=(_num_sms(config, bool(interpret)),),
      grid_names=("sm",),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  # One freshly built metadata buffer: Mosaic GPU custom calls need 256-byte aligned inputs,
  # and slices of plan.group_offsets are not (measured: "Input buffer 1 is not 256-byte
  # aligned" on H200).
  meta = jnp.stack([starts, ends, block_starts, num_blocks]).astype(jnp.int32)
  return kernel(meta, lhs, rhs)


def dw1(x: jax.Array, dh: jax.Array, plan: RoutingPlan, *, config: WgradConfig | None = None,
        interpret=False, x_gathered: jax.Array | None = None) -> jax.Array:
  """dW1 = Σ_{p in e} x[gather_idx[p]]ᵀ ⊗ dH[p]: x (T, d), dH (P, 2n) -> (E, d, 2n).

  x_gathered: optional (P, d) = x[plan.gather_idx] when the caller already has it.
  """
  if getattr(x, "ndim", None) != 2 or x.shape[0] != plan.num_tokens:
    raise ValueError(f"x must have shape (T, d) with T = {plan.num_tokens}, got {jnp.shape(x)}")
  lhs = x[plan.gather_idx] if x_gathered is None else x_gathered
  config = config or wgrad_config_for(lhs.shape[-1], dh.shape[-1])
  _validate(lhs, dh, plan, config, ("x[gather_idx]", "dh"))
  return grouped_outer(lhs, dh, plan, config=config, interpret=interpret)


def dw2(dout: jax.Array, a_prime: jax.Array, plan: RoutingPlan, *,
        config: WgradConfig | None = None, interpret=False,
        dout_gathered: jax.Array | None = None) -> jax.Array:
  """dW2 = Σ_{p in e} A'[p]ᵀ ⊗ dout[gather_idx[p]]: dout (T, d), A' (P, n) -> (E, n, d).

  dout_gathered: optional (P, d) = dout[plan.gather_idx] when the caller already has it.
  """
  if getattr(dout, "ndim", None) != 2 or dout.shape[0] != plan.num_tokens:
    raise ValueError(
        f"dout must have shape (T, d) with T = {plan.num_tokens}, got {jnp.shape(dout)}")
  rhs = dout[plan.gather_idx] if dout_gathered is None else dout_gathered
  config = config or wgrad_config_for(a_prime.shape[-1], rhs.shape[-1])
  _validate(a_prime, rhs, plan, config, ("a_prime", "dout[gather_idx]"))
  return grouped_outer(a_prime, rhs, plan, config=config, interpret=interpret)


__all__ = ["WgradConfig", "grouped_outer", "dw1", "dw2", "validate_wgrad_shapes",
           "wgrad_config_for"]
