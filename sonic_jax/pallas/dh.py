"""Down-projection backward (dH) as a Pallas Mosaic GPU varlen-M grouped GEMM, Hopper.

For every grouped row p of expert e (spec §4, SonicMoE's minimal-activation backward):

  dA'[p] = dO[gather_idx[p]] · W2[e]ᵀ                       (fp32 accumulator, never stored)
  A[p]   = silu(H_gate[p]) · H_up[p]                        (recomputed from H in the epilogue)
  dS[p]  = Σ_j dA'[p, j] · A[p, j]                          (fp32)
  dH[p]  = s_p · dSwiGLU(dA'[p]) in concat layout            (h.dtype)
  A'[p]  = s_p · A[p]                                       (h.dtype, the dW2 operand)

M tiles come from ``TileMetadata`` (each tile lies inside one expert and starts at its group's
first row, so no kernel loop over all experts). Rows of an M tile past its group's end are
computed (wasted) but never stored: row-ragged TMA stores go through a power-of-two ladder of
static-size descriptors. dS is reduced per (M tile, N tile) in registers and written as full
per-tile partial rows, then summed over N tiles in JAX: deterministic and free of atomics.

The dO gather is an XLA gather feeding the kernel (the first fast path of
docs/pallas-backward.md); the kernel's lhs is the gathered (P, d) matrix.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sonic_jax.pallas.tiles import TileMetadata, make_tile_metadata
from sonic_jax.routing import RoutingPlan

_F32 = jnp.float32
_OPERAND_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class DhConfig:
  """Static tiling of the dH kernel.

  block_m: rows per M tile (wgmma M; 64 per warpgroup). block_n: columns of n per tile (the
  epilogue handles the gate and up halves of the same columns). block_k: reduction step over d.
  max_concurrent_steps: TMA pipeline depth. grid_block_n: L2 tile swizzle width (planar snake).
  epi_n: columns processed at once in the epilogue (bounds register pressure).
  num_sms: persistent CTAs; None = the device's SM count (2 in interpret mode).
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 8
  epi_n: int = 64
  num_sms: int | None = None

  def __post_init__(self):
    for f in ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n", "epi_n"):
      v = getattr(self, f)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DhConfig.{f} must be a positive int, got {v!r}")
    if self.block_m % 64:
      raise ValueError(f"DhConfig.block_m must be a multiple of 64, got {self.block_m}")
    if self.block_n % self.epi_n or self.epi_n % 8:
      raise ValueError(
          f"DhConfig.epi_n must be a multiple of 8 dividing block_n ({self.block_n}), got "
          f"{self.epi_n}")


def _num_sms(config, interpret: bool) -> int:
  if config.num_sms is not None:
    return config.num_sms
  if interpret:
    return 2
  return getattr(jax.devices()[0], "core_count", None) or 132


def interpret_params(interpret):
  """``interpret`` (bool or InterpretGPUParams) -> the kernel's ``interpret`` argument."""
  if not interpret:
    return False
  if isinstance(interpret, plgpu.InterpretGPUParams):
    return interpret
  # Tiles may read past the last row (the GPU's TMA zero-fills there); the interpreter returns
  # NaN for such reads, which only ever lands in rows that are not stored or are masked.
  return plgpu.InterpretGPUParams(out_of_bounds_reads="uninitialized")


def _store_rows(src_smem, dst_gmem, num_rows, max_rows: int):
  """TMA-stores src_smem[:num_rows] to dst_gmem[:num_rows] (num_rows traced, <= max_rows).

  TMA boxes are static, so a ladder of power-of-two descriptors covers any row count.
  """
  offset = jnp.int32(0)
  size = 1 << int(math.log2(max_rows))
  while size >= 1:
    @pl.when((num_rows & size) != 0)
    def _(size=size, offset=offset):
      plgpu.copy_smem_to_gmem(src_smem.at[pl.ds(offset, size)], dst_gmem.at[pl.ds(offset, size)])
    offset = offset + (num_rows & size)
    size //= 2


def validate_dh_args(dout, w2, h, scores_grouped, plan: RoutingPlan, config: DhConfig) -> None:
  """Raises ValueError naming the argument and the rule for inputs the kernel cannot take."""
  if getattr(dout, "ndim", None) != 2:
    raise ValueError(f"dout must have shape (T, d), got {jnp.shape(dout)}")
  t, d = dout.shape
  if getattr(w2, "ndim", None) != 3 or w2.shape[2] != d:
    raise ValueError(f"w2 must have shape (E, n, d) with d = {d}, got {jnp.shape(w2)}")
  e, n, _ = w2.shape
  p = plan.capacity
  if e != plan.num_experts:
    raise ValueError(f"w2.shape[0] must equal plan.num_experts ({plan.num_experts}), got {e}")
  if t != plan.num_tokens:
    raise ValueError(f"dout.shape[0] must equal plan.num_tokens ({plan.num_tokens}), got {t}")
  if getattr(h, "ndim", None) != 2 or h.shape != (p, 2 * n):
    raise ValueError(f"h must have shape (P, 2n) = {(p, 2 * n)}, got {jnp.shape(h)}")
  if jnp.shape(scores_grouped) != (p,):
    raise ValueError(f"scores_grouped must have shape (P,) = {(p,)}, got "
                     f"{jnp.shape(scores_grouped)}")
  for name, a in (("dout", dout), ("w2", w2), ("h", h)):
    if jnp.dtype(a.dtype) not in _OPERAND_DTYPES:
      raise ValueError(f"{name} must be bfloat16 or float16, got {a.dtype}")
  if not dout.dtype == w2.dtype == h.dtype:
    raise ValueError(f"dout, w2 and h must share a dtype, got {dout.dtype}, {w2.dtype}, {h.dtype}")
  if d % config.block_k:
    raise ValueError(f"d ({d}) must be a multiple of DhConfig.block_k ({config.block_k})")
  if n % config.block_n:
    raise ValueError(f"n ({n}) must be a multiple of DhConfig.block_n ({config.block_n})")


def _tile_of_row(plan: RoutingPlan, tiles: TileMetadata):
  """(P,) grouped row -> (its M tile, its row inside the tile, valid)."""
  bm = tiles.block_m
  p = jnp.arange(plan.capacity, dtype=jnp.int32)
  offsets = plan.group_offsets
  e = jnp.clip(jnp.searchsorted(offsets[1:], p, side="right"), 0, plan.num_experts - 1)
  tiles_per_expert = (plan.group_sizes + bm - 1) // bm
  tile_begin = jnp.cumsum(tiles_per_expert, dtype=jnp.int32) - tiles_per_expert
  local = p - offsets[e]
  return tile_begin[e] + local // bm, local % bm, p < offsets[-1]


def dh(dout: jax.Array, w2: jax.Array, h: jax.Array, scores_grouped: jax.Array,
       plan: RoutingPlan, *, config: DhConfig | None = None, interpret=False,
       dout_gathered: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """dH / A' / dS of the down projection.

  dout (T, d), w2 (E, n, d), h (P, 2n) concat layout, scores_grouped (P,) fp32.
  dout_gathered: optional (P, d) = dout[plan.gather_idx] when the caller already has it.
  Returns dH (P, 2n) h.dtype, A' (P, n) h.dtype, dS (P,) fp32 (0 on padding rows), grouped order.
  """
  config = config or DhConfig()
  validate_dh_args(dout, w2, h, scores_grouped, plan, config)
  num_experts, n, d = w2.shape
  p_rows = plan.capacity
  bm, bn, bk, epi_n = config.block_m, config.block_n, config.block_k, config.epi_n
  dtype = h.dtype
  tiles = make_tile_metadata(plan.group_sizes, plan.group_offsets, block_m=bm, capacity=p_rows)
  tiles_max = tiles.expert.shape[0]
  grid_n = n // bn
  lhs = dout[plan.gather_idx] if dout_gathered is None else dout_gathered
  if lhs.shape != (p_rows, d):
    raise ValueError(f"dout_gathered must have shape (P, d) = {(p_rows, d)}, got {lhs.shape}")
  scores_grouped = scores_grouped.astype(_F32)

  def body(expert_gmem, row_start_gmem, rows_gmem, lhs_gmem, w2_gmem, h_gmem, s_gmem,
           dh_gmem, ap_gmem, dsp_gmem):
    @plgpu.nd_loop((tiles_max * grid_n,), collective_axes="sm")
    def _(loop_info: plgpu.NDLoopInfo):
      mi, ni = plgpu.planar_snake(loop_info.index[0], (tiles_max, grid_n), 1,
                                  config.grid_block_n)
      rows = rows_gmem[mi]

      @pl.when(rows > 0)
      def _():
        e = expert_gmem[mi]
        row_start = row_start_gmem[mi]
        m_slice = pl.ds(row_start, bm)  # may run past P on the last tile: never stored

        def acc_scope(acc_ref):
          plgpu.emit_pipeline(
              lambda _, a_smem, b_smem: plgpu.wgmma(acc_ref, a_smem, b_smem.T),
              grid=(d // bk,),
              in_specs=[
                  plgpu.BlockSpec((bm, bk), lambda k: (0, k), delay_release=1),
                  plgpu.BlockSpec((bn, bk), lambda k: (ni, k), delay_release=1),
              ],
              max_concurrent_steps=config.max_concurrent_steps,
          )(lhs_gmem.at[m_slice], w2_gmem.at[e])
          return acc_ref[...]

        acc = pl.run_scoped(acc_scope, plgpu.ACC((bm, bn)))

        @functools.partial(
            pl.run_scoped,
            gate_smem=plgpu.SMEM((bm, bn), dtype),
            up_smem=plgpu.SMEM((bm, bn), dtype),
            dgate_smem=plgpu.SMEM((bm, bn), dtype),
            dup_smem=plgpu.SMEM((bm, bn), dtype),
            ap_smem=plgpu.SMEM((bm, bn), dtype),
            s_smem=plgpu.SMEM((bm,), _F32),
            ds_smem=plgpu.SMEM((bm,), _F32),
            barriers=plgpu.Barrier(num_barriers=3),
        )
        def _(gate_smem, up_smem, dgate_smem, dup_smem, ap_smem, s_smem, ds_smem, barriers):
          plgpu.copy_gmem_to_smem(h_gmem.at[m_slice, pl.ds(ni * bn, bn)], gate_smem,
                                  barriers.at[0])
          plgpu.copy_gmem_to_smem(h_gmem.at[m_slice, pl.ds(n + ni * bn, bn)], up_smem,
                                  barriers.at[1])
          plgpu.copy_gmem_to_smem(s_gmem.at[m_slice], s_smem, barriers.at[2])
          for i in range(3):
            plgpu.barrier_wait(barriers.at[i])
          s = plgpu.load(s_smem, layout=plgpu.Layout.WGMMA.reduce(1))
          ds = None
          # Column chunks keep only epi_n columns of gate/up/temporaries live in registers.
          for c in range(bn // epi_n):
            cols = slice(c * epi_n, (c + 1) * epi_n)
            da = acc[:, cols]
            gate = gate_smem[:, cols].astype(_F32)
            up = up_smem[:, cols].astype(_F32)
            sig = 1.0 / (1.0 + jnp.exp(-gate))
            silu = gate * sig
            a = silu * up
            part = jnp.sum(da * a, axis=1)
            ds = part if ds is None else ds + part
            s_b = lax.broadcast_in_dim(s, (bm, epi_n), [0])
            ds_b = da * s_b
            dgate_smem[:, cols] = (ds_b * up * sig * (1.0 + gate * (1.0 - sig))).astype(dtype)
            dup_smem[:, cols] = (ds_b * silu).astype(dtype)
            ap_smem[:, cols] = (a * s_b).astype(dtype)
          ds_smem[...] = ds
          plgpu.commit_smem()
          _store_rows(dgate_smem, dh_gmem.at[pl.ds(row_start, bm), pl.ds(ni * bn, bn)], rows, bm)
          _store_rows(dup_smem, dh_gmem.at[pl.ds(row_start, bm), pl.ds(n + ni * bn, bn)], rows,
                      bm)
          _store_rows(ap_smem, ap_gmem.at[pl.ds(row_start, bm), pl.ds(ni * bn, bn)], rows, bm)
          plgpu.copy_smem_to_gmem(ds_smem, dsp_gmem.at[ni, mi])
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kernel = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((p_rows, 2 * n), dtype),
                jax.ShapeDtypeStruct((p_rows, n), dtype),
                jax.ShapeDtypeStruct((grid_n, tiles_max, bm), _F32)),
      grid=(_num_sms(config, bool(interpret)),),
      grid_names=("sm",),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  dh_out, a_prime, ds_part = kernel(tiles.expert, tiles.row_start, tiles.rows, lhs, w2, h,
                                    scores_grouped)
  tile, within, valid = _tile_of_row(plan, tiles)
  ds = jnp.sum(ds_part[:, jnp.minimum(tile, tiles_max - 1), within], axis=0)
  return dh_out, a_prime, jnp.where(valid, ds, 0.0)


__all__ = ["DhConfig", "dh", "validate_dh_args"]
