"""Expert weight gradients dW1, dW2 as Pallas Mosaic GPU varlen-K grouped GEMMs, Hopper.

  dW1[e] = Σ_{p in e} x[gather_idx[p]]ᵀ ⊗ dH[p]    -> (E, d, 2n)
  dW2[e] = Σ_{p in e} A'[p]ᵀ ⊗ dO[gather_idx[p]]   -> (E, n, d)

Both are ``out[e] = lhs[rows of e]ᵀ · rhs[rows of e]`` with the reduction (K) running over the
expert's grouped rows. A persistent grid walks (expert, M tile, N tile); each output tile
pipelines the expert's K blocks with TMA and accumulates with wgmma (lhs tile transposed in
SMEM). K blocks are aligned to block_k (the ring kernel's to 8, from the expert's first row),
so an expert's first and last block can hold rows of a neighbour (or padding rows, which may be
NaN): those two blocks are masked in registers with a select (not a multiply, so NaN never
leaks) and written back to SMEM before the wgmma. Every
output tile is written once by one CTA: deterministic, no atomics; empty experts give zeros.

The row gather (x or dO by gather_idx) is by default an XLA gather feeding the kernel
(``WgradConfig(gather="xla")``). ``gather="fused"`` reads the gathered rows inside the kernel
instead (``_grouped_outer_fused``): a producer warpgroup walks its CTA's (expert, M tile, N tile,
K block) sequence and fills one ring that runs across output tiles, the plain operand by TMA and
the gathered one (x for dW1, dO for dW2) by cp.async (``cp_async.py``, as up_proj and dh do);
one consumer warpgroup masks the boundary blocks, runs the wgmma and stores the tile. No (P, d)
gathered copy of x or dO exists in HBM.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sonic_jax.pallas import cp_async
from sonic_jax.pallas.dh import interpret_params
from sonic_jax.pallas.grid import (CLUSTER_AXIS, cluster_kwargs, cluster_rank, multicasts,
                                   persistent_ctas, release_barrier)
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
  gather: "xla" (the gathered operand is an XLA gather before the kernel, the default) or
  "fused" (cp.async inside the kernel; a producer warpgroup + one consumer warpgroup, the ring
  of max_concurrent_steps (>= 2) stages running across output tiles; ``smem_bytes``). The
  gathered tile is (block_k rows, block_m or block_n columns): its width in bytes must be 32, 64
  or a multiple of 128 dividing 2048. num_compute_wgs: 1 or 2 consumer
  warpgroups. 2 runs the ring kernel (also with gather="xla", where the pre-gathered operand
  comes by TMA instead of cp.async): the two split the plain operand's columns of the tile
  (block_n for dW1, block_m for dW2), each half a multiple of 64, and share the gathered tile.
  cluster_m: 1, or 2 for 2-CTA clusters on the ring kernel: the two CTAs of a cluster take
  neighbouring tiles along the gathered side's feature dim (M for dW1, N for dW2; that tile
  count must be even) of one expert, so they share the plain operand's K-block tile, which
  comes by TMA multicast (each CTA reads half of it from L2); the slots are released through a
  ClusterBarrier. In the interpreter (no cluster barriers) each CTA loads its own plain tile.
  Session 17: not yet run on a GPU.
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 1
  out_dtype: str | None = None
  num_sms: int | None = None
  gather: Literal["xla", "fused"] = "xla"
  num_compute_wgs: int = 1
  cluster_m: int = 1

  def __post_init__(self):
    for f in ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n"):
      v = getattr(self, f)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"WgradConfig.{f} must be a positive int, got {v!r}")
    if self.block_m % 64:
      raise ValueError(f"WgradConfig.block_m must be a multiple of 64, got {self.block_m}")
    # The boundary-block mask holds a (block_k, ·) K block in the wgmma register layout, whose
    # rows come in 64s (block_k = 32 fails Mosaic GPU's layout cast).
    if self.block_k % 64:
      raise ValueError(f"WgradConfig.block_k must be a multiple of 64, got {self.block_k}")
    if self.out_dtype not in (None, "float32"):
      raise ValueError(f"WgradConfig.out_dtype must be None or 'float32', got {self.out_dtype!r}")
    if self.gather not in ("xla", "fused"):
      raise ValueError(f"WgradConfig.gather must be 'xla' or 'fused', got {self.gather!r}")
    if self.num_compute_wgs not in (1, 2):
      raise ValueError(f"WgradConfig.num_compute_wgs must be 1 or 2, got {self.num_compute_wgs}")
    if self.cluster_m not in (1, 2):
      raise ValueError(f"WgradConfig.cluster_m must be 1 or 2, got {self.cluster_m!r}")
    if self.cluster_m == 2 and not self.ring:
      raise ValueError("WgradConfig.cluster_m = 2 needs the ring kernel (gather='fused' or "
                       f"num_compute_wgs=2), got gather={self.gather!r}, "
                       f"num_compute_wgs={self.num_compute_wgs}")
    if self.ring and self.max_concurrent_steps < 2:
      raise ValueError(f"WgradConfig.max_concurrent_steps must be >= 2 with gather='fused' or "
                       f"num_compute_wgs=2 (the ring kernel: the consumer frees a stage one step "
                       f"late), got {self.max_concurrent_steps}")

  @property
  def ring(self) -> bool:
    """Whether the warp-specialized ring kernel runs (a producer warpgroup, a ring across
    output tiles): with the fused gather, or with two consumer warpgroups."""
    return self.gather == "fused" or self.num_compute_wgs == 2


SMEM_LIMIT = 220 * 1024  # of the 227 KiB a Hopper CTA can use; the rest for barriers


def smem_bytes(config: WgradConfig, itemsize: int = 2) -> int:
  """SMEM of one CTA: the K-block ring and the staged output tile. With gather="xla" the
  output tile reuses the ring's space (separate scopes); in the ring kernel (``config.ring``)
  the ring runs across tiles (the producer fills the next tile's stages during this tile's
  store), so both stay."""
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  ring = config.max_concurrent_steps * bk * (bm + bn) * itemsize
  out = bm * bn * (4 if config.out_dtype == "float32" else itemsize)
  return ring + out if config.ring else max(ring, out)


def wgrad_config_for(m: int, n: int, *, gather: Literal["xla", "fused"] = "xla",
                     gathered: Literal["lhs", "rhs"] | None = None) -> WgradConfig:
  """Default tiling for an (E, m, n) output.

  With ``gathered`` (the row-gathered side: "lhs" for dW1 = xᵀ·dH, "rhs" for dW2 = A'ᵀ·dO)
  and the other side's dim a multiple of 256: two consumer warpgroups sharing the gathered
  tile, a 256-wide plain side, 3 stages, for either ``gather`` (fused on H200 at T=32768,
  d=4096, n=1024, E=128, K=8: dW1 8.25 ms, dW2 4.28 ms, against 11.02 / 6.48 ms with one
  consumer; benchmarks/results/pallas-backward-gathers-h200-2026-12-03-s5.md).
  Otherwise 128-wide tiles where the shape allows, else 64; planar-snake width 4; 5 stages
  with gather="xla" (dW1 at the same shape: 6.52 ms against 6.76 ms with 4 stages and width
  1), with "fused" the deepest ring (<= 5) that fits SMEM next to the output tile."""
  config = WgradConfig(block_m=128 if m % 128 == 0 else 64,
                       block_n=128 if n % 128 == 0 else 64,
                       max_concurrent_steps=5, grid_block_n=4)
  # Two consumers on the ring kernel, for either gather. With gather="xla" both operands come
  # by TMA (H200, same shape, pallas-backward-wgrad-h200-2026-12-03-s7.md: dW1 6.555 ms, dW2
  # 3.224 ms, against 6.718 / 3.367 ms for the one-consumer 128 x 128 default). Its K blocks
  # from each expert's first row rounded down to 8 (session 14) instead of block_k-aligned
  # ones: DeepSeek-V3-like (T=16384, d=7168, n=2048, E=256, K=8, ~512 rows per expert) dW1
  # 15.53 vs 17.96 ms, dW2 7.25 vs 8.84; T=32768, d=4096, n=1024, E=128, K=8: 7.10 vs 7.31 and
  # 3.46 vs 3.58 (kernel-profile-h200-2026-12-04-s14*.log, different device calls).
  if gathered == "lhs" and n % 256 == 0 and m % 128 == 0:
    return WgradConfig(block_m=128, block_n=256, max_concurrent_steps=3, grid_block_n=4,
                       gather=gather, num_compute_wgs=2)
  if gathered == "rhs" and m % 256 == 0 and n % 128 == 0:
    return WgradConfig(block_m=256, block_n=128, max_concurrent_steps=3, grid_block_n=4,
                       gather=gather, num_compute_wgs=2)
  if gather == "xla":
    return config
  for steps in (5, 4, 3, 2):
    fused = dataclasses.replace(config, gather="fused", max_concurrent_steps=steps)
    if smem_bytes(fused) <= SMEM_LIMIT:
      return fused
  return dataclasses.replace(config, gather="fused", max_concurrent_steps=2)


def _validate(lhs, rhs, plan: RoutingPlan, config: WgradConfig, names,
              shared: Literal["lhs", "rhs"] | None = None) -> None:
  ln, rn = names
  p = plan.capacity
  for name, a in ((ln, lhs), (rn, rhs)):
    if getattr(a, "ndim", None) != 2 or a.shape[0] != p:
      raise ValueError(f"{name} must have shape (P, ·) with P = {p} rows, got {jnp.shape(a)}")
    if jnp.dtype(a.dtype) not in _OPERAND_DTYPES:
      raise ValueError(f"{name} must be bfloat16 or float16, got {a.dtype}")
  if lhs.dtype != rhs.dtype:
    raise ValueError(f"{ln} and {rn} must share a dtype, got {lhs.dtype} and {rhs.dtype}")
  validate_wgrad_shapes(lhs.shape[1], rhs.shape[1], config, names, gathered=shared)


def validate_wgrad_shapes(m: int, n: int, config: WgradConfig, names=("lhs", "rhs"),
                          gathered: Literal["lhs", "rhs"] | None = None) -> None:
  """Raises ValueError when an (E, m, n) output cannot be tiled by ``config``; ``names`` name
  the (P, m) and (P, n) operands; ``gathered`` names the side a fused gather reads (the rule on
  its tile width applies with ``config.gather == "fused"``), or with gather="xla" the side the
  two consumer warpgroups share."""
  ln, rn = names
  if m % config.block_m:
    raise ValueError(f"{ln}.shape[1] ({m}) must be a multiple of WgradConfig.block_m "
                     f"({config.block_m})")
  if n % config.block_n:
    raise ValueError(f"{rn}.shape[1] ({n}) must be a multiple of WgradConfig.block_n "
                     f"({config.block_n})")
  if config.gather == "fused" and gathered is not None:
    field, cols = (("block_m", config.block_m) if gathered == "lhs"
                   else ("block_n", config.block_n))
    row = cols * 2  # bf16 / f16 bytes of one gathered tile row
    if not cp_async.gather_row_ok(cols, 2):
      raise ValueError(
          f"WgradConfig.{field} ({cols}) with gather='fused' must make the gathered tile row "
          f"(the {ln if gathered == 'lhs' else rn} side, {row} bytes) 32, 64 or a multiple of "
          f"128 bytes dividing {cp_async.WARPGROUP * cp_async.CHUNK_BYTES}")
  if config.num_compute_wgs == 2 and gathered is not None:
    field, cols = (("block_n", config.block_n) if gathered == "lhs"
                   else ("block_m", config.block_m))
    if cols % 128:
      raise ValueError(f"WgradConfig.{field} ({cols}) must be a multiple of 128 with "
                       f"num_compute_wgs = 2 (the two consumer warpgroups split it in halves "
                       f"of a multiple of 64)")
  if config.cluster_m == 2:
    if gathered is None:
      raise ValueError("WgradConfig.cluster_m = 2 runs on the ring kernel of dw1 / dw2 only")
    field, tiles = (("block_m", m // config.block_m) if gathered == "lhs"
                    else ("block_n", n // config.block_n))
    if tiles % 2:
      raise ValueError(f"WgradConfig.cluster_m = 2 pairs the tiles along the gathered side: "
                       f"{ln if gathered == 'lhs' else rn}.shape[1] / {field} ({tiles}) must "
                       f"be even")
  if smem_bytes(config) > SMEM_LIMIT:
    raise ValueError(f"WgradConfig {config} needs {smem_bytes(config)} bytes of SMEM, more "
                     f"than {SMEM_LIMIT}: lower max_concurrent_steps, block_k, block_m or "
                     f"block_n")


# Row alignment of the ring kernel's K blocks: Mosaic GPU's TMA into an (8, ·)-tiled SMEM tile
# needs the GMEM row offset to be a multiple of the tile's 8 rows (unaligned offsets make its
# layout inference search without end).
_ROW_ALIGN = 8


def _block_meta(plan: RoutingPlan, bk: int, aligned: bool = True) -> jax.Array:
  """(4, E) int32 (5, E unaligned): first row, end row, first K block's row, number of K blocks
  per expert.

  aligned: K blocks start at multiples of bk (the first and last can hold a neighbour's rows);
  else at the expert's first row rounded down to a multiple of _ROW_ALIGN (fewer blocks: the
  first holds fewer than _ROW_ALIGN rows of the previous expert), and a fifth row holds the
  number of valid rows (group_offsets[E]; padding rows follow) in every column.

  One freshly built buffer: Mosaic GPU custom calls need 256-byte aligned inputs, and slices of
  plan.group_offsets are not (measured: "Input buffer 1 is not 256-byte aligned" on H200)."""
  starts = plan.group_offsets[:-1]
  ends = plan.group_offsets[1:]
  if aligned:
    block_starts = (starts // bk) * bk
    num_blocks = jnp.where(ends > starts, (ends + bk - 1) // bk - starts // bk, 0)
  else:
    block_starts = (starts // _ROW_ALIGN) * _ROW_ALIGN
    num_blocks = jnp.where(ends > starts, (ends - block_starts + bk - 1) // bk, 0)
    valid = jnp.broadcast_to(plan.group_offsets[-1], starts.shape)
    return jnp.stack([starts, ends, block_starts, num_blocks, valid]).astype(jnp.int32)
  return jnp.stack([starts, ends, block_starts, num_blocks]).astype(jnp.int32)


def _mask_rows(ref, row0, start, end, rows: int, cols: int) -> None:
  """Zeroes the rows of an SMEM (rows, cols) K block outside [start, end) with a select (not a
  multiply: padding rows may hold NaN)."""
  r = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (rows, cols), 0),
                        plgpu.Layout.WGMMA) + row0
  keep = (r >= start) & (r < end)
  v = ref[...]
  ref[...] = jnp.where(keep, v, jnp.zeros_like(v))


def grouped_outer(lhs: jax.Array, rhs: jax.Array, plan: RoutingPlan, *,
                  config: WgradConfig | None = None, interpret=False,
                  shared: Literal["lhs", "rhs"] = "lhs",
                  names: tuple[str, str] = ("lhs", "rhs")) -> jax.Array:
  """out[e] = Σ_{p in group e} lhs[p]ᵀ ⊗ rhs[p]: lhs (P, M), rhs (P, N) -> (E, M, N).

  Both operands are already in grouped order; ``config.gather`` must be "xla" here (dw1 / dw2
  take the ungathered source and run the fused gather themselves). With
  ``config.num_compute_wgs == 2`` the ring kernel runs with both operands by TMA; ``shared``
  names the operand whose tile both consumer warpgroups read (the other's columns are split).
  ``names`` name lhs and rhs in error messages."""
  config = config or wgrad_config_for(lhs.shape[-1], rhs.shape[-1])
  if config.gather != "xla":
    raise ValueError("grouped_outer takes gathered operands: WgradConfig.gather must be 'xla' "
                     "here; use dw1 / dw2 for gather='fused'")
  if shared not in ("lhs", "rhs"):
    raise ValueError(f"shared must be 'lhs' or 'rhs', got {shared!r}")
  _validate(lhs, rhs, plan, config, names, shared=shared)
  if config.num_compute_wgs == 2:
    return _grouped_outer_fused(lhs, rhs, plan, config, shared, interpret)
  p_rows, m = lhs.shape
  n = rhs.shape[1]
  g = plan.num_experts
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  out_dtype = jnp.float32 if config.out_dtype == "float32" else lhs.dtype
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
            _mask_rows(lhs_smem, row0, start, end, bk, bm)
            _mask_rows(rhs_smem, row0, start, end, bk, bn)
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
      grid=(persistent_ctas(config.num_sms, interpret),),
      grid_names=("sm",),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  return kernel(_block_meta(plan, bk), lhs, rhs)


_PRODUCER_REGS = 40  # the TMA + cp.async producer warpgroup
_CONSUMER_REGS = 232  # (65536 - 128·40) / 256 with two consumers; the mask holds a K block too


def _grouped_outer_fused(lhs: jax.Array, rhs: jax.Array, plan: RoutingPlan, config: WgradConfig,
                         gathered: Literal["lhs", "rhs"], interpret) -> jax.Array:
  """grouped_outer with one operand's rows gathered in the kernel: the ``gathered`` side is the
  (T, ·) source read at plan.gather_idx, the other (plain) side is (P, ·) in grouped order.

  Warp-specialized: the last warpgroup (producer) walks its CTA's (expert, M tile, N tile) work
  items and, for each, the expert's K blocks, filling a ``max_concurrent_steps``-deep ring: the
  plain operand by TMA (one copy per consumer half, ``full_t``), the gathered rows
  src[gather_idx[row0 : row0 + block_k], c0 : c0 + cols] by cp.async (``full_g``, cp_async.py),
  rows outside the expert zero-filled by the copy itself. The consumer warpgroup(s) wait for
  both, zero their slice of the plain operand's rows outside the expert in the first and last K
  block (a select: padding rows may hold NaN), run the wgmma (lhs transposed from SMEM), release
  each stage on ``empty`` one step late (after ``wgmma_wait(1)``), and store their part of the
  tile through SMEM by TMA. Global step g of a CTA uses slot g % slots for the (g // slots)-th
  time, which gives ``full_g``'s phase parity; all warpgroups derive g from the same per-expert
  block counts. The ring does not restart per tile, so the next tile's loads overlap this
  tile's store. Empty experts issue no step and store a zero tile.

  K blocks start at the expert's first row rounded down to a multiple of 8 (not of block_k), so
  an expert takes one K step fewer than with block_k-aligned blocks as often as not; its first
  and last block can hold rows of another expert, which each consumer zeroes in its plain tile.

  With ``config.gather == "xla"`` (two consumers on operands gathered by XLA) the ``gathered``
  side is (P, ·) in grouped order too and comes by TMA (counted on ``full_t``); its rows past
  the expert are a neighbour's gathered rows (finite), cancelled by the zeroed plain rows,
  except where the last block reaches the padding rows after every group: there the first
  consumer zeroes them in the shared tile too and both consumers meet on ``masked``.
  """
  p_rows = plan.capacity
  m = lhs.shape[1]
  n = rhs.shape[1]
  g_experts = plan.num_experts
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  wgs = config.num_compute_wgs
  slots = config.max_concurrent_steps
  dtype = lhs.dtype
  itemsize = jnp.dtype(dtype).itemsize
  out_dtype = jnp.float32 if config.out_dtype == "float32" else dtype
  interp = bool(interpret)
  pregathered = config.gather == "xla"
  grid_m, grid_n = m // bm, n // bn
  # K blocks start at multiples of bk and may run past P (the last one): pad the gather index
  # with token 0 (a valid row, zero-filled by the copy since it lies outside every expert).
  blocks = -(-p_rows // bk) + 1
  gidx = (None if pregathered else
          jnp.pad(plan.gather_idx.astype(jnp.int32), (0, blocks * bk - p_rows)))
  lhs_is_gathered = gathered == "lhs"
  cluster_m = config.cluster_m
  multicast = multicasts(cluster_m, interp)
  g_cols = bm if lhs_is_gathered else bn
  # Each consumer takes 1/wgs of the plain operand's columns: (bk, t_cols) per copy.
  t_cols = (bn if lhs_is_gathered else bm) // wgs
  acc_shape = (bm, t_cols) if lhs_is_gathered else (t_cols, bn)

  def body(*refs):
    if pregathered:
      meta_gmem, lhs_gmem, rhs_gmem, o_gmem, g_ring, t_ring, o_smem, full_t, empty, masked = refs
      gidx_gmem = full_g = None
    else:
      (meta_gmem, gidx_gmem, lhs_gmem, rhs_gmem, o_gmem, g_ring, t_ring, o_smem, full_g, full_t,
       empty) = refs
    wg = lax.axis_index("wg")
    if not pregathered:
      cp_async.init_barriers(full_g, slots, interpret=interp)

    # With 2-CTA clusters both CTAs walk the same items, pairs of tiles along the gathered
    # side's dim (M for dW1, N for dW2), and take the tile of the pair given by their rank:
    # they share the plain operand's tile.
    rank = cluster_rank(cluster_m)
    pm, pn = (cluster_m, 1) if lhs_is_gathered else (1, cluster_m)

    def items_loop(item_body):
      @plgpu.nd_loop((g_experts, grid_m // pm * (grid_n // pn)), collective_axes="sm",
                     init_carry=jnp.int32(0))
      def _loop(info: plgpu.NDLoopInfo, carry):
        gi = info.index[0]
        mi, ni = plgpu.planar_snake(info.index[1], (grid_m // pm, grid_n // pn), 1,
                                    config.grid_block_n)
        if pm > 1:
          mi = mi * pm + rank
        if pn > 1:
          ni = ni * pn + rank
        nblocks = meta_gmem[3, gi]
        item_body(gi, mi, ni, nblocks, carry)
        return carry + nblocks  # global K step of this CTA: the ring position
      return _loop

    @pl.when(wg == wgs)
    def _producer():
      plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")

      def item(gi, mi, ni, nblocks, g0):
        start, end = meta_gmem[0, gi], meta_gmem[1, gi]
        block_start = meta_gmem[2, gi]

        @pl.loop(0, nblocks)
        def _k(k):
          g = g0 + k
          slot = cp_async.ring_slot(g, slots)
          row0 = pl.multiple_of(block_start + k * bk, _ROW_ALIGN)

          @pl.when(g >= slots)
          def _():
            plgpu.barrier_wait(empty.at[slot])
          for c in range(wgs):
            if lhs_is_gathered:
              t_src = rhs_gmem.at[pl.ds(row0, bk), pl.ds(ni * bn + c * t_cols, t_cols)]
            else:
              t_src = lhs_gmem.at[pl.ds(row0, bk), pl.ds(mi * bm + c * t_cols, t_cols)]
            # multicast: both CTAs of the cluster receive the whole plain tile.
            plgpu.copy_gmem_to_smem(t_src, t_ring.at[slot, c], full_t.at[slot],
                                    collective_axes=CLUSTER_AXIS if multicast else None)
          g_src, c0 = (lhs_gmem, mi * bm) if lhs_is_gathered else (rhs_gmem, ni * bn)
          if pregathered:
            plgpu.copy_gmem_to_smem(g_src.at[pl.ds(row0, bk), pl.ds(c0, g_cols)],
                                    g_ring.at[slot], full_t.at[slot])
          else:
            cp_async.issue_gather(gidx_gmem, g_src, g_ring, full_g, slot=slot, row0=row0, k0=c0,
                                  block_m=bk, block_k=g_cols, interpret=interp,
                                  valid=(start, end))

      total = items_loop(item)

      cp_async.drain_releases(empty, total, slots)

    @pl.when(wg < wgs)
    def _consumers():
      plgpu.set_max_registers(_CONSUMER_REGS, action="increase")

      def item(gi, mi, ni, nblocks, g0):
        start, end = meta_gmem[0, gi], meta_gmem[1, gi]
        block_start = meta_gmem[2, gi]

        def acc_scope(acc_ref):
          @pl.loop(0, nblocks)
          def _k(k):
            g = g0 + k
            slot = cp_async.wait_stage(full_t, full_g, g=g, slots=slots, interpret=interp)
            t_tile = t_ring.at[slot, wg]

            # K blocks start at the expert's first row rounded down to 8: the first block can
            # hold a few rows of the previous expert, the last can run past the expert into a
            # neighbour's rows, padding rows (which may hold NaN) or the zero fill past P.
            # Each consumer zeroes those rows of its own plain tile with a select; the zeroed
            # rows cancel the shared tile's rows there, which are a neighbour's (finite) rows
            # or zero fill, unless the block reaches the padding rows: then the first consumer
            # masks the shared tile too and both meet on ``masked``.
            row0 = block_start + k * bk
            last = (k == nblocks - 1) & (lax.rem(end - block_start, bk) != 0)

            @pl.when(last | ((k == 0) & (start != block_start)))
            def _():
              _mask_rows(t_tile, row0, start, end, bk, t_cols)
              plgpu.commit_smem()
            if pregathered:
              @pl.when(last & (row0 + bk > meta_gmem[4, 0]))
              def _():
                @pl.when(wg == 0)
                def _():
                  _mask_rows(g_ring.at[slot], row0, start, end, bk, g_cols)
                  plgpu.commit_smem()
                plgpu.barrier_arrive(masked)
                plgpu.barrier_wait(masked)

            if lhs_is_gathered:
              plgpu.wgmma(acc_ref, g_ring.at[slot].T, t_tile)
            else:
              plgpu.wgmma(acc_ref, t_tile.T, g_ring.at[slot])
            plgpu.wgmma_wait(1)  # step g - 1's wgmma is done: its stage can be refilled

            @pl.when(k > 0)
            def _():
              plgpu.barrier_arrive(empty.at[cp_async.ring_slot(g - 1 + slots, slots)])
          acc = acc_ref[...]  # waits for every wgmma of the tile

          @pl.when(nblocks > 0)
          def _():
            plgpu.barrier_arrive(empty.at[cp_async.ring_slot(g0 + nblocks - 1, slots)])
          return acc

        acc = pl.run_scoped(acc_scope, plgpu.ACC(acc_shape))
        # An empty expert runs no step: its accumulator keeps its zero initialization.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous tile's store read o_smem
        o_smem.at[wg][...] = acc.astype(out_dtype)
        plgpu.commit_smem()
        if lhs_is_gathered:
          dst = o_gmem.at[gi, pl.ds(mi * bm, bm), pl.ds(ni * bn + wg * t_cols, t_cols)]
        else:
          dst = o_gmem.at[gi, pl.ds(mi * bm + wg * t_cols, t_cols), pl.ds(ni * bn, bn)]
        plgpu.copy_smem_to_gmem(o_smem.at[wg], dst)

      items_loop(item)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  rings = [
      # The gathered ring is (8, swizzle)-tiled for cp.async (untiled in the interpreter, which
      # checks no layouts); the TMA rings' layouts are left to Mosaic GPU's inference.
      plgpu.SMEM((slots, bk, g_cols), dtype,
                 transforms=() if interp or pregathered
                 else cp_async.a_transforms(g_cols, itemsize)),
      plgpu.SMEM((slots, wgs, bk, t_cols), dtype),
      plgpu.SMEM((wgs, *acc_shape), out_dtype),
  ]
  empty_barrier = release_barrier(wgs, slots, multicast)
  if pregathered:
    scratch = [
        *rings,
        # full_t: one TMA per consumer's half of the plain operand + the shared tile's TMA.
        plgpu.Barrier(num_arrivals=wgs + 1, num_barriers=slots),
        empty_barrier,  # empty: the consumers' releases
        plgpu.Barrier(num_arrivals=wgs),  # masked: the shared tile's padding rows are zero
    ]
  else:
    scratch = [
        *rings,
        cp_async.barrier_scratch(slots, interpret=interp),  # full_g: the gathered rows
        plgpu.Barrier(num_arrivals=wgs, num_barriers=slots),  # full_t: one TMA per consumer
        empty_barrier,  # empty: the consumers' releases
    ]
  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((g_experts, m, n), out_dtype),
      grid=(persistent_ctas(config.num_sms, interp) // cluster_m,),
      grid_names=("sm",),
      **cluster_kwargs(cluster_m),
      num_threads=wgs + 1,
      thread_name="wg",
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  meta = _block_meta(plan, bk, aligned=False)
  if pregathered:
    return kernel(meta, lhs, rhs)
  return kernel(meta, gidx, lhs, rhs)


def _validate_fused(plain, src, plan: RoutingPlan, config: WgradConfig, names,
                    gathered: Literal["lhs", "rhs"]) -> None:
  """Checks of the fused path: ``src`` (T, ·) is the gathered side, ``plain`` (P, ·) the other;
  ``names`` = (lhs name, rhs name)."""
  src_name, plain_name = (names if gathered == "lhs" else names[::-1])
  if getattr(plain, "ndim", None) != 2 or plain.shape[0] != plan.capacity:
    raise ValueError(f"{plain_name} must have shape (P, ·) with P = {plan.capacity} rows, got "
                     f"{jnp.shape(plain)}")
  for name, a in ((src_name, src), (plain_name, plain)):
    if jnp.dtype(a.dtype) not in _OPERAND_DTYPES:
      raise ValueError(f"{name} must be bfloat16 or float16, got {a.dtype}")
  if src.dtype != plain.dtype:
    raise ValueError(f"{src_name} and {plain_name} must share a dtype, got {src.dtype} and "
                     f"{plain.dtype}")
  m, n = ((src.shape[1], plain.shape[1]) if gathered == "lhs"
          else (plain.shape[1], src.shape[1]))
  validate_wgrad_shapes(m, n, config, names, gathered=gathered)


def dw1(x: jax.Array, dh: jax.Array, plan: RoutingPlan, *, config: WgradConfig | None = None,
        interpret=False, x_gathered: jax.Array | None = None) -> jax.Array:
  """dW1 = Σ_{p in e} x[gather_idx[p]]ᵀ ⊗ dH[p]: x (T, d), dH (P, 2n) -> (E, d, 2n).

  x_gathered: optional (P, d) = x[plan.gather_idx] when the caller already has it; not allowed
  with ``config.gather == "fused"`` (which reads x's rows in the kernel): ValueError.
  """
  if getattr(x, "ndim", None) != 2 or x.shape[0] != plan.num_tokens:
    raise ValueError(f"x must have shape (T, d) with T = {plan.num_tokens}, got {jnp.shape(x)}")
  config = config or wgrad_config_for(x.shape[-1], jnp.shape(dh)[-1])
  if config.gather == "fused":
    if x_gathered is not None:
      raise ValueError("x_gathered must be None with WgradConfig(gather='fused'): the kernel "
                       "gathers the rows of x itself")
    _validate_fused(dh, x, plan, config, ("x[gather_idx]", "dh"), "lhs")
    return _grouped_outer_fused(x, dh, plan, config, "lhs", interpret)
  lhs = x[plan.gather_idx] if x_gathered is None else x_gathered
  return grouped_outer(lhs, dh, plan, config=config, interpret=interpret, shared="lhs",
                       names=("x[gather_idx]", "dh"))


def dw2(dout: jax.Array, a_prime: jax.Array, plan: RoutingPlan, *,
        config: WgradConfig | None = None, interpret=False,
        dout_gathered: jax.Array | None = None) -> jax.Array:
  """dW2 = Σ_{p in e} A'[p]ᵀ ⊗ dout[gather_idx[p]]: dout (T, d), A' (P, n) -> (E, n, d).

  dout_gathered: optional (P, d) = dout[plan.gather_idx] when the caller already has it; not
  allowed with ``config.gather == "fused"``: ValueError.
  """
  if getattr(dout, "ndim", None) != 2 or dout.shape[0] != plan.num_tokens:
    raise ValueError(
        f"dout must have shape (T, d) with T = {plan.num_tokens}, got {jnp.shape(dout)}")
  config = config or wgrad_config_for(jnp.shape(a_prime)[-1], dout.shape[-1])
  if config.gather == "fused":
    if dout_gathered is not None:
      raise ValueError("dout_gathered must be None with WgradConfig(gather='fused'): the kernel "
                       "gathers the rows of dout itself")
    _validate_fused(a_prime, dout, plan, config, ("a_prime", "dout[gather_idx]"), "rhs")
    return _grouped_outer_fused(a_prime, dout, plan, config, "rhs", interpret)
  rhs = dout[plan.gather_idx] if dout_gathered is None else dout_gathered
  return grouped_outer(a_prime, rhs, plan, config=config, interpret=interpret, shared="rhs",
                       names=("a_prime", "dout[gather_idx]"))


__all__ = ["WgradConfig", "grouped_outer", "dw1", "dw2", "smem_bytes", "validate_wgrad_shapes",
           "wgrad_config_for"]
