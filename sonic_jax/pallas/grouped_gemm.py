"""Varlen-M grouped GEMMs for Hopper (Mosaic GPU): out[p] = lhs[src(p)] · rhs[e(p)] per M-tile.

One kernel family serves up_proj (gathered x · W1 with a SwiGLU epilogue), down_proj (A · W2) and
dx_pairs (dH · W1ᵀ, transposed rhs). Expert groups are tiled by ``tiles.make_tiles`` with 8-row
aligned windows (computed in JAX once per call; a tile never mixes two experts and no kernel loops
over all experts). Each tile loads a full ``block_m`` rows window starting at a multiple of 8
(clamped to the array, so rows of a neighbouring group may be multiplied and dropped) and stores
only its own rows with a ladder of power-of-two TMA stores, so rows outside the groups are never
written.

The row gather of lhs (x[gather_idx]) is done either by XLA before the kernel (``gather="xla"``)
or inside the kernel (``gather="fused"``: a producer warpgroup copies the gathered rows with
cp.async straight into the swizzled wgmma tiles, ``cp_async.py``; no (rows, k) gathered copy in
HBM; see docs/pallas-forward.md).
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sonic_jax.pallas import cp_async
from sonic_jax.pallas.grid import (CLUSTER_AXIS, cluster_kwargs, cluster_rank, multicasts,
                                   persistent_ctas, release_barrier)
from sonic_jax.pallas import tiles as tiles_lib
from sonic_jax.pallas.configs import GemmConfig

Epilogue = Literal["none", "swiglu"]

_F32 = jnp.float32
_PRODUCER_REGS = 40  # the cp.async / TMA producer warpgroup of the fused-gather kernel


def _consumer_regs(wgs: int) -> int:
  # 512 registers per thread slot across the warpgroups (64K per SM / 128 threads), in 8s.
  return min(240, (512 - _PRODUCER_REGS) // wgs // 8 * 8)


def _interpret_params(interpret):
  if interpret is True:
    return plgpu.InterpretGPUParams()
  return interpret or None


def _ragged_store(smem, gmem, *, off, rows, dst_row, max_rows: int):
  """Stores smem rows [off, off + rows) to gmem rows [dst_row, dst_row + rows).

  TMA boxes are static, so the dynamic row count is decomposed into powers of two (one static
  descriptor per power of two <= max_rows), each store predicated on its bit of ``rows``.
  """
  start = off
  size = 1 << int(math.log2(max_rows))
  while size >= 1:
    @pl.when((rows & size) != 0)
    def _():
      plgpu.copy_smem_to_gmem(smem.at[pl.ds(start, size)],
                              gmem.at[pl.ds(dst_row + start - off, size)])
    start = start + (rows & size)
    size //= 2


def staging_smem(shape, dtype, transforms, swizzled: bool):
  """SMEM for epilogue staging buffers (grouped_gemm's and dh's): untiled (the ragged store
  ladder slices it at any row), or with ``swizzled`` a union of a ``transforms`` (tiled,
  swizzled) view and the untiled view of the same bytes, for full tiles' conflict-free register
  stores and one-TMA copies; ``staging_views`` splits it."""
  if not swizzled:
    return plgpu.SMEM(shape, dtype)
  return plgpu.RefUnion(plgpu.SMEM(shape, dtype, transforms=transforms),
                        plgpu.SMEM(shape, dtype))


def staging_views(ref, swizzled: bool):
  """A ``staging_smem`` buffer -> (untiled view, swizzled view or None)."""
  return (ref[1], ref[0]) if swizzled else (ref, None)


def _swiglu_f32(g, u):
  # silu(g) * u on the fp32 accumulators; exp(-g) -> inf for very negative g gives -0, not NaN.
  return g / (1.0 + jnp.exp(-g)) * u


def epilogue_tiles(swiglu: bool, inference: bool) -> int:
  return 2 if swiglu and not inference else 1


def smem_bytes(config: GemmConfig, *, epilogue: Epilogue, inference: bool = False,
               itemsize: int = 2) -> int:
  """Static SMEM footprint of one CTA (pipeline ring + epilogue tiles), in bytes."""
  swiglu = epilogue == "swiglu"
  bm, bn, bk, wgs = config.block_m, config.block_n, config.block_k, config.num_compute_wgs
  n_b = 2 if swiglu else 1
  stage = (bm * bk + n_b * bk * config.block_n_cta) * itemsize
  epi = wgs * epilogue_tiles(swiglu, inference) * config.block_m_wg * bn * itemsize
  ring = config.max_concurrent_steps * stage
  if config.ring:  # ring and epilogue tiles live together
    return ring + epi
  # One warpgroup: the pipeline's ring is freed before the epilogue tiles are allocated.
  return ring + epi if wgs > 1 else max(ring, epi)


SMEM_LIMIT = 220 * 1024  # of the 227 KiB a Hopper CTA can use; the rest for barriers
# Of a consumer thread's <= 240 registers: the rest hold addresses, the epilogue's values and
# SwiGLU's temporaries. Every heuristic tiling keeps 128.
ACC_REGS_LIMIT = 160


def validate_gemm(m_lhs: int, k: int, n_out: int, config: GemmConfig, *, epilogue: Epilogue,
                  what: str) -> None:
  """Raises ValueError when (k, n_out) cannot be tiled by ``config``. ``what`` names the GEMM."""
  bn_cta = config.block_n_cta
  if smem_bytes(config, epilogue=epilogue) > SMEM_LIMIT:
    raise ValueError(f"{what}: config {config} needs {smem_bytes(config, epilogue=epilogue)} "
                     f"bytes of SMEM, more than {SMEM_LIMIT}")
  acc_regs = (2 if epilogue == "swiglu" else 1) * config.block_m_wg * config.block_n // 128
  if acc_regs > ACC_REGS_LIMIT:
    raise ValueError(f"{what}: config {config} keeps {acc_regs} fp32 accumulator registers per "
                     f"thread (accumulators x rows per warpgroup x block_n / 128), more than "
                     f"{ACC_REGS_LIMIT}; halve block_n or split the rows (wg_split='m')")
  if k % config.block_k:
    raise ValueError(f"{what}: the contraction dim ({k}) must be a multiple of block_k "
                     f"({config.block_k})")
  if config.pingpong and config.pingpong_ring == "shared":
    cp_async.check_shared_ring_steps(
        k // config.block_k, config.max_concurrent_steps,
        f"{what}: wg_split='pingpong' needs the contraction's k steps ({k} / block_k")
  if n_out % bn_cta:
    rule = "block_n * num_compute_wgs" if config.wg_split == "n" else "block_n (wg_split='m')"
    raise ValueError(f"{what}: the output dim ({n_out}) must be a multiple of {rule} "
                     f"({bn_cta}, the CTA tile's width)")
  del m_lhs, epilogue


def grouped_gemm(
    lhs: jax.Array,  # (M, k): grouped rows, or token rows when gather_idx is given
    rhs: jax.Array,  # (E, k, N), or (E, N, k) with transpose_rhs
    group_sizes: jax.Array,  # (E,) int32
    group_offsets: jax.Array,  # (E+1,) int32
    *,
    num_rows: int,
    gather_idx: jax.Array | None = None,  # (num_rows,) int32 grouped row -> lhs row
    transpose_rhs: bool = False,
    epilogue: Epilogue = "none",
    inference: bool = False,
    config: GemmConfig = GemmConfig(),
    interpret=False,
):
  """Grouped GEMM over expert groups; returns (num_rows, N) or, for SwiGLU, (H, A).

  Rows [group_offsets[e], group_offsets[e+1]) of lhs (or of lhs[gather_idx]) are multiplied by
  rhs[e]; the M-tiles are ``tiles.make_tiles(align=8)`` metadata computed here, once per call,
  in JAX.

  epilogue "none": out (num_rows, N) in lhs.dtype. "swiglu": N = 2n (concat layout), returns
  H (num_rows, 2n) (None when ``inference``) and A = silu(H_gate)·H_up (num_rows, n), both from
  the fp32 accumulator. Rows outside the tiles are left unwritten (undefined).
  """
  if epilogue == "swiglu" and transpose_rhs:
    raise ValueError("epilogue='swiglu' does not support transpose_rhs")
  if lhs.dtype != rhs.dtype:
    raise ValueError(f"lhs and rhs must have the same dtype, got {lhs.dtype} and {rhs.dtype}")
  num_experts = rhs.shape[0]
  k = lhs.shape[1]
  n_total = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  k_rhs = rhs.shape[2] if transpose_rhs else rhs.shape[1]
  if k_rhs != k:
    raise ValueError(f"lhs contraction dim {k} != rhs contraction dim {k_rhs}")
  n_out = n_total // 2 if epilogue == "swiglu" else n_total
  validate_gemm(lhs.shape[0], k, n_out, config, epilogue=epilogue, what="grouped_gemm")
  bm = config.block_m

  if gather_idx is not None and config.gather == "xla":
    lhs = lhs[gather_idx]
    gather_idx = None
  # Every tile reads a full block_m window starting on a multiple of 8 rows: keep the loaded
  # array at least block_m tall and a multiple of 8 rows (a copy only for odd tiny shapes).
  out_rows = max(num_rows, bm)
  if config.epilogue_swizzle:
    # The swizzled store's TMA tiles the output's rows by 8: a multiple of 8 rows (sliced
    # back below: a copy only where num_rows is not, e.g. 111 rows under 64-row tiles).
    out_rows = -(-out_rows // 8) * 8
  src_rows = lhs.shape[0] if gather_idx is None else gather_idx.shape[0]
  m_src = -(-max(src_rows, bm) // 8) * 8
  if gather_idx is None and m_src != src_rows:
    lhs = jnp.pad(lhs, ((0, m_src - src_rows), (0, 0)))
  if gather_idx is not None and m_src != src_rows:
    gather_idx = jnp.pad(gather_idx, (0, m_src - src_rows))
  tiles = tiles_lib.make_tiles(group_sizes, group_offsets, block_m=bm, align=8,
                               capacity=num_rows, m_rows=m_src, pair=config.cluster_m == 2)

  outs = _build_kernel(
      m_src=m_src, k=k, n_total=n_total, num_experts=num_experts, out_rows=out_rows,
      dtype=lhs.dtype, transpose_rhs=transpose_rhs, epilogue=epilogue, inference=inference,
      fused_gather=gather_idx is not None, config=config, interpret=interpret)(
          tiles.expert, tiles.load, tiles.dst, tiles.rows,
          jnp.reshape(tiles.num_tiles, (1,)).astype(jnp.int32),
          *(() if gather_idx is None else (gather_idx.astype(jnp.int32),)), lhs, rhs)
  outs = [o if o.shape[0] == num_rows else o[:num_rows] for o in outs]
  if epilogue == "swiglu":
    return (None, outs[0]) if inference else (outs[0], outs[1])
  return outs[0]


def _build_kernel(*, m_src, k, n_total, num_experts, out_rows, dtype, transpose_rhs, epilogue,
                  inference, fused_gather, config: GemmConfig, interpret):
  del num_experts
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  wgs = config.num_compute_wgs
  bn_cta = config.block_n_cta
  bm_wg = config.block_m_wg  # accumulator rows per consumer warpgroup
  split_m = config.wg_split == "m"
  # Ping-pong: each consumer warpgroup runs whole tiles (no slicing), taken in turn.
  pingpong = config.pingpong
  swiglu = epilogue == "swiglu"
  n_out = n_total // 2 if swiglu else n_total
  cluster_m = config.cluster_m
  multicast = multicasts(cluster_m, interpret)
  grid_n = n_out // bn_cta
  k_steps = k // bk
  # Output operands: plain -> [out]; swiglu -> [H, A] or [A].
  if swiglu:
    out_cols = [n_total, n_out] if not inference else [n_out]
  else:
    out_cols = [n_total]
  out_type = [jax.ShapeDtypeStruct((out_rows, c), dtype) for c in out_cols]
  # SMEM epilogue tiles per compute warpgroup (SwiGLU training: gate and up, then A).
  n_epi = epilogue_tiles(swiglu, inference)
  # Ring slots allocated: the interpreter runs the shared ping-pong ring as two rings of its
  # full depth (it forbids the shared ring's skipped phases; SMEM size is not checked there).
  split_ring = pingpong and (config.pingpong_ring == "split" or bool(interpret))
  shared_ring = pingpong and not split_ring  # one ring, consumers ordered by turn barriers
  alloc_slots = config.max_concurrent_steps * (
      2 if pingpong and config.pingpong_ring == "shared" and interpret else 1)
  num_accs = 2 if swiglu else 1
  max_store_rows = min(bm_wg, out_rows)

  def rhs_specs(ni_fn):
    """BlockSpecs of the rhs operands (gate and up for SwiGLU) for column block ni."""
    if transpose_rhs:
      return [plgpu.BlockSpec((bn_cta, bk), lambda kk: (ni_fn(), kk), delay_release=1)]
    specs = [plgpu.BlockSpec((bk, bn_cta), lambda kk: (kk, ni_fn()), delay_release=1)]
    if swiglu:
      specs.append(plgpu.BlockSpec((bk, bn_cta), lambda kk: (kk, ni_fn() + grid_n),
                                   delay_release=1))
    return specs

  def tile_info(expert_ref, load_ref, dst_ref, rows_ref, mi):
    e = expert_ref[mi]
    row_load = pl.multiple_of(load_ref[mi], 8)  # lets the TMA into swizzled SMEM lower
    row_start = dst_ref[mi]
    return e, row_start, rows_ref[mi], row_load, row_start - row_load

  swizzled = config.epilogue_swizzle
  epi_swizzle = plgpu.find_swizzle(bn * jnp.dtype(dtype).itemsize * 8)
  epi_transforms = (plgpu.TilingTransform((8, epi_swizzle // jnp.dtype(dtype).itemsize)),
                    plgpu.SwizzleTransform(epi_swizzle))

  def epi_alloc(shape):
    """SMEM for the epilogue tiles (``staging_smem``)."""
    return staging_smem(shape, dtype, epi_transforms, swizzled)

  def epilogue_store(accs, out_refs, epi, *, col, row_start, rows, off, row_load):
    """accs: fp32 values (bm_wg, bn) of this warpgroup: the window of bm_wg rows loaded from
    row_load, of which rows [off, off + rows) go to output rows row_start.., columns col..

    epi: (n_epi, bm_wg, bn) untiled SMEM, or (swizzled view, untiled view) of one buffer."""
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # previous tile's stores left epi_smem

    def stage(epi_smem, items):  # registers -> SMEM, made visible to the TMA engine
      for j, (v, _, _) in enumerate(items):
        epi_smem[j] = v.astype(dtype)
      plgpu.commit_smem()

    def flush_ragged(epi_smem, items):
      stage(epi_smem, items)
      for j, (_, ref, c0) in enumerate(items):
        _ragged_store(epi_smem.at[j], ref.at[:, pl.ds(c0, bn)], off=off, rows=rows,
                      dst_row=row_start, max_rows=max_store_rows)

    def flush_full(epi_smem, items):
      # rows == bm_wg: the window is the tile (off == 0), its start a multiple of 8.
      stage(epi_smem, items)
      for j, (_, ref, c0) in enumerate(items):
        plgpu.copy_smem_to_gmem(epi_smem.at[j], ref.at[pl.ds(pl.multiple_of(row_load, 8), bm_wg),
                                                       pl.ds(pl.multiple_of(c0, bn), bn)])

    def flush(items):
      if not swizzled:
        flush_ragged(epi, items)
        return
      epi_swz, epi_lin = epi

      @pl.when(rows == bm_wg)
      def _():
        flush_full(epi_swz, items)

      @pl.when(rows != bm_wg)
      def _():
        flush_ragged(epi_lin, items)

    if swiglu:
      g, u = accs
      a = _swiglu_f32(g, u)
      if inference:
        flush([(a, out_refs[0], col)])
      else:
        # Two SMEM tiles: H gate and H up first, then A reuses the first once TMA has read it.
        flush([(g, out_refs[0], col), (u, out_refs[0], n_out + col)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        flush([(a, out_refs[1], col)])
    else:
      flush([(accs[0], out_refs[0], col)])
    plgpu.commit_smem_to_gmem_group()

  def wgmma_step(accs, a_smem, b_smems, wg_slice):
    """wg_slice: this warpgroup's rows of the A tile (split_m) or columns of the B tiles."""
    if split_m:
      a_smem = a_smem.at[wg_slice]
    split_b = wgs > 1 and config.wg_split == "n"
    for acc, b in zip(accs, b_smems):
      if transpose_rhs:
        b_op = b.at[wg_slice].T if split_b else b.T
      else:
        b_op = b.at[:, wg_slice] if split_b else b
      plgpu.wgmma(acc, a_smem, b_op)

  def wg_window(wg, row_start, rows, off, row_load):
    """(row_start, rows, off, row_load) of warpgroup wg's bm_wg-row part of a tile's window
    (split_m); the tile's own values otherwise. rows is 0 when no valid row falls in it."""
    if not split_m:
      return row_start, rows, off, row_load
    base = wg * bm_wg
    lo = jnp.maximum(off, base)
    hi = jnp.minimum(off + rows, base + bm_wg)
    rows_w = jnp.maximum(hi - lo, 0)
    off_w = jnp.where(rows_w > 0, lo - base, 0)
    return row_start + jnp.maximum(lo - off, 0), rows_w, off_w, row_load + base

  # ---------------------------------------------------------------- single warpgroup, XLA gather
  def body_single(expert_ref, load_ref, dst_ref, rows_ref, ntiles_ref, lhs_ref, rhs_ref, *rest):
    out_refs = rest[:len(out_cols)]
    num_tiles = ntiles_ref[0]

    @plgpu.nd_loop((num_tiles * grid_n,), collective_axes="sm")
    def _tile_loop(info: plgpu.NDLoopInfo):
      mi, ni = plgpu.planar_snake(info.index[0], (num_tiles, grid_n), 1, config.grid_tile_width)
      e, row_start, rows, row_load, off = tile_info(expert_ref, load_ref, dst_ref, rows_ref, mi)

      def acc_scope(*acc_refs):
        def step(_, a_smem, *b_smems):
          wgmma_step(acc_refs, a_smem, b_smems, None)
          # delay_release=1: the previous step's slots are refilled after this body, so its
          # wgmmas must be done; this step's stay in flight under the next TMA wait.
          plgpu.wgmma_wait(1)

        plgpu.emit_pipeline(
            step, grid=(k_steps,),
            in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), delay_release=1),
                      *rhs_specs(lambda: ni)],
            max_concurrent_steps=config.max_concurrent_steps,
        )(lhs_ref.at[pl.ds(row_load, bm)], *([rhs_ref.at[e]] * (1 + (swiglu and not transpose_rhs))))
        return tuple(a[...] for a in acc_refs)

      accs = pl.run_scoped(acc_scope, *[plgpu.ACC((bm, bn), _F32) for _ in range(num_accs)])

      @functools.partial(pl.run_scoped, epi_smem=epi_alloc((n_epi, bm, bn)))
      def _store(epi_smem):
        epilogue_store(accs, out_refs, epi_smem, col=ni * bn_cta, row_start=row_start,
                       rows=rows, off=off, row_load=row_load)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  # ------------------------------------- warp specialized: 1 TMA warpgroup + wgs consumer groups
  def body_ws(expert_ref, load_ref, dst_ref, rows_ref, ntiles_ref, lhs_ref, rhs_ref, *rest):
    out_refs = rest[:len(out_cols)]
    num_tiles = ntiles_ref[0]

    def get_pipeline(body, compute_context, ni_fn):
      return plgpu.emit_pipeline_warp_specialized(
          body, grid=(k_steps,), memory_registers=40,
          in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), delay_release=1),
                    *rhs_specs(ni_fn)],
          wg_axis="wg", num_compute_wgs=wgs,
          max_concurrent_steps=config.max_concurrent_steps,
          compute_context=compute_context)

    ignore = lambda *_, **__: None
    n_rhs = 1 + (swiglu and not transpose_rhs)
    dummy_rhs = [rhs_ref.at[0]] * n_rhs

    @functools.partial(
        pl.run_scoped,
        allocs=get_pipeline(ignore, ignore, lambda: 0).get_allocations(
            lhs_ref.at[pl.ds(0, bm)], *dummy_rhs),
        epi_smem=epi_alloc((wgs, n_epi, bm, bn)),
        # Arrived on by each consumer once its last wgmma of a tile is done, awaited by the
        # producer before the next tile's first loads (see below).
        tile_done=plgpu.Barrier(num_arrivals=wgs),
        collective_axes="wg")
    def _scope(allocs, epi_smem, tile_done):
      wg = lax.axis_index("wg")

      @plgpu.nd_loop((num_tiles * grid_n,), collective_axes="sm")
      def _tile_loop(info: plgpu.NDLoopInfo):
        mi, ni = plgpu.planar_snake(info.index[0], (num_tiles, grid_n), 1,
                                    config.grid_tile_width)
        e, row_start, rows, row_load, off = tile_info(expert_ref, load_ref, dst_ref, rows_ref, mi)
        wg_slice = pl.ds(wg * bn, bn)

        def compute_context(eval_pipeline):
          def acc_scope(*acc_refs):
            eval_pipeline(tuple(acc_refs))
            accs = tuple(a[...] for a in acc_refs)  # waits for every wgmma of the tile
            plgpu.barrier_arrive(tile_done)
            epi = (tuple(r.at[wg] for r in epi_smem) if swizzled else epi_smem.at[wg])
            epilogue_store(accs, out_refs, epi, col=ni * bn_cta + wg * bn, row_start=row_start,
                           rows=rows, off=off, row_load=row_load)
          pl.run_scoped(acc_scope, *[plgpu.ACC((bm, bn), _F32) for _ in range(num_accs)])

        def step(_, a_smem, *rest_refs):
          *b_smems, carry = rest_refs
          wgmma_step(carry, a_smem, b_smems, wg_slice)
          plgpu.wgmma_wait(1)  # as in the single-warpgroup body (delay_release=1)
          return carry

        get_pipeline(step, compute_context, lambda: ni)(
            lhs_ref.at[pl.ds(row_load, bm)], *([rhs_ref.at[e]] * n_rhs), allocations=allocs)

        # With delay_release=1 the pipeline never releases the slot of a tile's last k step
        # (the release of step s happens in step s + 1), so its producer would start the next
        # tile's loads, which reuse every slot, while the consumers may still read that slot;
        # with a single k step (k == block_k) it waits for no release at all and runs tiles
        # ahead, overrunning the full-barrier phases (a hang or stale data on the GPU, "awaiting
        # phase 2, but barrier is already at phase 3" in the interpreter). Waiting here for the
        # consumers' end-of-tile arrival closes both. Consumers of tile t + 1 need loads issued
        # after this wait, so tile_done never runs more than one phase ahead.
        @pl.when(wg == wgs)
        def _():
          plgpu.barrier_wait(tile_done)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  # ------------------- fused gather: cp.async producer warpgroup + wgs consumer warpgroups
  # Own pipeline (emit_pipeline's producer only issues TMA): a ring of `slots` stages, each an A
  # tile (gathered rows, written by the producer's 128 threads with cp.async, cp_async.py) and the
  # B tiles (TMA). Per slot: full_a (completes when every producer thread's copies of the stage
  # have landed: cp.async.mbarrier.arrive.noinc), full_b (the B TMAs), empty (one arrival per
  # consumer warpgroup once its wgmmas of the stage are done). Global step g of a CTA uses slot
  # g % slots for the (g // slots)-th time, which gives full_a's phase parity.
  # Without a gather (``config.cross_tile``), the same ring with the A tile loaded by TMA too
  # (full_b then counts it): unlike emit_pipeline_warp_specialized, which restarts per tile and
  # whose producer must wait for the consumers' end of tile, the producer here runs across tiles,
  # so the next tile's loads overlap this tile's last steps and epilogue.
  # Ping-pong (config.pingpong): the CTA's j-th (tile, N block) item goes to consumer warpgroup
  # j % 2; one consumer releases each stage. Two forms (config.pingpong_ring):
  # "shared": one ring; each consumer skips the other's items. Mosaic GPU tracks a barrier's
  # phase by counting the waiting thread's own waits (no parity argument), so a skipped item
  # must use every slot an even number of times: k_steps a multiple of 2 · slots
  # (validate_gemm), which leaves the skipping warpgroup's phase bits as they were. The two
  # consumers' mainloops are ordered by the `turn` barriers (warpgroup w waits on turn[w]
  # before an item, the other arrives once its last wgmma of the previous item is issued), so
  # no full barrier is waited on while two phases behind, where the older phase's parity would
  # pass. The interpreter forbids a waiter lagging a barrier by more than one phase, so there
  # this form runs as "split".
  # "split": two rings of slots // 2 stages side by side, item j in ring j % 2 as that ring's
  # (j // 2)-th item; each consumer waits on its own ring's barriers only, in order. The
  # running consumer has half the stages (session 14's dh form, DhConfig(pipelines=2)).
  def body_ring(*refs):
    if fused_gather:
      expert_ref, load_ref, dst_ref, rows_ref, ntiles_ref, gidx_ref, lhs_ref, rhs_ref, *rest = refs
    else:
      expert_ref, load_ref, dst_ref, rows_ref, ntiles_ref, lhs_ref, rhs_ref, *rest = refs
      gidx_ref = None
    out_refs = rest[:len(out_cols)]
    if fused_gather:
      a_ring, b_ring, epi_smem, full_a, full_b, empty, *turn = rest[len(out_cols):]
    else:
      a_ring, b_ring, epi_smem, full_b, empty, *turn = rest[len(out_cols):]
      full_a = None
    turn = turn[0] if turn else None  # the shared ping-pong ring's order barriers
    num_tiles = ntiles_ref[0]
    interp = bool(interpret)
    slots = alloc_slots // (2 if split_ring else 1)  # stages per ring
    n_rhs = num_accs
    wg = lax.axis_index("wg")

    def ring_of(g0):
      """(ring, ring-local first step, ring's first slot) of the item starting at CTA step g0
      (the item's consumer warpgroup is j % 2, j = g0 // k_steps)."""
      j = g0 // k_steps
      if not split_ring:
        return lax.rem(j, 2), g0, 0
      return lax.rem(j, 2), (j // 2) * k_steps, lax.rem(j, 2) * slots
    if fused_gather:
      cp_async.init_barriers(full_a, alloc_slots, interpret=interp)
    # With 2-CTA clusters both CTAs walk the same (tile pair, N block) items, each the tile of
    # the pair given by its rank (the tiles come in pairs of one expert: make_tiles(pair=True)).
    rank = cluster_rank(cluster_m)

    def tiles_loop(body):
      @plgpu.nd_loop((num_tiles // cluster_m * grid_n,), collective_axes="sm",
                     init_carry=jnp.int32(0))
      def _loop(info: plgpu.NDLoopInfo, carry):
        pi, ni = plgpu.planar_snake(info.index[0], (num_tiles // cluster_m, grid_n), 1,
                                    config.grid_tile_width)
        body(pi * cluster_m + rank, ni, carry)
        return carry + k_steps  # global k step of this CTA (the ring position)
      return _loop

    @pl.when(wg == wgs)
    def _producer():
      plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")

      def tile(mi, ni, g0):
        e, _, _, row_load, _ = tile_info(expert_ref, load_ref, dst_ref, rows_ref, mi)
        _, gr0, base = ring_of(g0)

        @pl.loop(0, k_steps)
        def _k(kk):
          g = gr0 + kk
          slot = cp_async.ring_slot(g, slots, base)

          @pl.when(g >= slots)
          def _():
            plgpu.barrier_wait(empty.at[slot])
          for j in range(n_rhs):
            c0 = (ni + j * grid_n) * bn_cta
            if transpose_rhs:
              src = rhs_ref.at[e, pl.ds(c0, bn_cta), pl.ds(kk * bk, bk)]
            else:
              src = rhs_ref.at[e, pl.ds(kk * bk, bk), pl.ds(c0, bn_cta)]
            # multicast: each CTA of the cluster loads part of the tile and both receive all
            # of it (each full_b expects the whole tile's bytes).
            plgpu.copy_gmem_to_smem(src, b_ring.at[slot, j], full_b.at[slot],
                                    collective_axes=CLUSTER_AXIS if multicast else None)
          if fused_gather:
            cp_async.issue_gather(gidx_ref, lhs_ref, a_ring, full_a, slot=slot, row0=row_load,
                                  k0=kk * bk, block_m=bm, block_k=bk, interpret=interp)
          else:
            plgpu.copy_gmem_to_smem(lhs_ref.at[pl.ds(row_load, bm), pl.ds(kk * bk, bk)],
                                    a_ring.at[slot], full_b.at[slot])

      total = tiles_loop(tile)

      if split_ring:
        items = total // k_steps  # ring 0 took the even items, ring 1 the odd ones
        cp_async.drain_releases(empty, (items + 1) // 2 * k_steps, slots, 0)
        cp_async.drain_releases(empty, items // 2 * k_steps, slots, slots)
      else:
        cp_async.drain_releases(empty, total, slots)

    @pl.when(wg < wgs)
    def _consumers():
      plgpu.set_max_registers(_consumer_regs(wgs), action="increase")
      if pingpong:
        wg_slice = None
      else:
        wg_slice = pl.ds(wg * bm_wg, bm_wg) if split_m else pl.ds(wg * bn, bn)

      def tile(mi, ni, g0):
        e, row_start, rows, row_load, off = tile_info(expert_ref, load_ref, dst_ref, rows_ref, mi)
        del e
        row_start, rows, off, row_load = wg_window(wg, row_start, rows, off, row_load)
        col = ni * bn_cta + (wg * bn if config.wg_split == "n" else 0)
        item = g0 // k_steps  # this CTA's item index
        owner, gr0, base = ring_of(g0)

        def acc_scope(*acc_refs):
          if shared_ring:
            cp_async.turn_wait(turn, wg, item)

          @pl.loop(0, k_steps)
          def _k(kk):
            g = gr0 + kk
            slot = cp_async.wait_stage(full_b, full_a, g=g, slots=slots, interpret=interp,
                                       base=base)
            wgmma_step(acc_refs, a_ring.at[slot], [b_ring.at[slot, j] for j in range(n_rhs)],
                       wg_slice)
            plgpu.wgmma_wait(1)  # step g - 1's wgmmas are done: its stage can be refilled

            @pl.when(kk > 0)
            def _():
              plgpu.barrier_arrive(empty.at[cp_async.ring_slot(g - 1 + slots, slots, base)])
          if shared_ring:
            cp_async.turn_arrive(turn, wg)  # every wgmma of this item is issued
          accs = tuple(a[...] for a in acc_refs)  # waits for every wgmma of the tile
          plgpu.barrier_arrive(empty.at[cp_async.ring_slot(gr0 + k_steps - 1, slots, base)])
          epi = (tuple(r.at[wg] for r in epi_smem) if swizzled else epi_smem.at[wg])
          epilogue_store(accs, out_refs, epi, col=col, row_start=row_start, rows=rows, off=off,
                         row_load=row_load)

        def run_tile():
          pl.run_scoped(acc_scope, *[plgpu.ACC((bm_wg, bn), _F32) for _ in range(num_accs)])

        if pingpong:
          pl.when(owner == wg)(run_tile)  # the other consumer's item: skipped
        else:
          run_tile()

      total = tiles_loop(tile)
      if shared_ring:
        cp_async.turn_drain(turn, wg, total // k_steps)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
  ctas = persistent_ctas(config.num_sms, interpret)
  common = dict(out_type=out_type, grid=(ctas // cluster_m,), grid_names=("sm",),
                compiler_params=params, interpret=_interpret_params(interpret))
  common.update(cluster_kwargs(cluster_m))
  if fused_gather or config.cross_tile:
    slots = alloc_slots
    itemsize = jnp.dtype(dtype).itemsize
    b_shape = (bn_cta, bk) if transpose_rhs else (bk, bn_cta)
    n_b = 1 if transpose_rhs else num_accs
    scratch = [
        # Untiled in the interpreter (it checks no layouts and its row stores need none).
        plgpu.SMEM((slots, bm, bk), dtype, transforms=(
            () if interpret else cp_async.a_transforms(bk, itemsize))),
        plgpu.SMEM((slots, n_b, *b_shape), dtype),
        epi_alloc((wgs, n_epi, bm_wg, bn)),
        *([cp_async.barrier_scratch(slots, interpret=bool(interpret))] if fused_gather else []),
        # The B TMAs (and the A TMA without a gather): one arrival per copy.
        plgpu.Barrier(num_arrivals=n_b + (0 if fused_gather else 1), num_barriers=slots),
        # empty: one arrival per consumer warpgroup (of each CTA of the cluster with multicast);
        # under ping-pong a slot has one consumer, the warpgroup of the item.
        release_barrier(1 if config.pingpong else wgs, slots, multicast),
        # The shared ping-pong ring: turn[w], on which consumer w waits before each of its
        # items but the first (cp_async.turn_wait).
        *([plgpu.Barrier(num_arrivals=1, num_barriers=2)] if shared_ring else []),
    ]
    return plgpu.kernel(body_ring, scratch_types=scratch, num_threads=wgs + 1,
                        thread_name="wg", **common)
  if wgs == 1:
    return plgpu.kernel(body_single, **common)
  return plgpu.kernel(body_ws, num_threads=wgs + 1, thread_name="wg", **common)
