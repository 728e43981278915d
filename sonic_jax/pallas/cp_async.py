"""Row-gathered GMEM -> swizzled SMEM loads with cp.async, for the producer warpgroup.

TMA on Hopper cannot gather rows (its gather4 mode is sm_100 only), and one 1-row TMA per row is
bound by the single issuing thread (docs/pallas-forward.md). SonicMoE's Hopper kernels gather
with cp.async instead: every thread of a producer warpgroup copies 16-byte chunks of the rows
it owns straight into the wgmma-ready (tiled, swizzled) SMEM tile. Pallas exposes cp.async only
for pre-Hopper GPUs, so these helpers emit it through ``plgpu.inline_mgpu``:

* ``issue_gather``: ``a[slot][r, :] = lhs[gidx[row0 + r], k0 : k0 + block_k]`` for every row r
  of the (block_m, block_k) tile, then ``cp.async.mbarrier.arrive.noinc`` on the slot's mbarrier:
  the barrier (initialized for 128 arrivals by ``init_barriers``) completes its phase once every
  thread's copies have landed, without the producer ever waiting for its own loads;
* ``wait_gathered``: a consumer's wait for that phase (its parity is known from the step count),
  then a generic -> async proxy fence, so the wgmma (async proxy) reads what cp.async (generic
  proxy) wrote;
* ``wait_stage`` / ``drain_releases``: the consumer's wait for a ring step and the producer's
  final wait for the consumers' releases, shared by the kernels whose ring runs across tiles
  (grouped_gemm's, dh's and wgrad's);
* ``turn_wait`` / ``turn_arrive`` / ``turn_drain``: the order of two ping-pong consumers on one
  shared ring (grouped_gemm's ``wg_split="pingpong"``, dh's ``pipeline_ring="shared"``).

These mbarriers are plain 8-byte SMEM words (``barrier_scratch``), not Pallas barriers: inline
Mosaic GPU code cannot take a Pallas barrier as an argument.

The destination layout is the one Mosaic GPU gives an SMEM ref with
``TilingTransform((8, swizzle / itemsize))`` + ``SwizzleTransform(swizzle)``, swizzle = the
tile row's bytes up to 128: (rows / 8, row bytes / swizzle, 8, swizzle) bytes, row-major, and
within each 8-row tile the 16-byte chunk c of row r lands in chunk
c ^ ((r % 8)·swizzle >> 7 & (swizzle / 16 - 1)), the hardware's swizzle pattern that TMA writes
and wgmma reads.

The interpreter cannot run ``inline_mgpu``; with ``interpret`` the same copy is done with plain
ref loads/stores into an untiled ring and the barriers are Pallas barriers (one arrival after the
copy), which keeps the kernel's protocol (who waits on which slot, in which order) the same in
CPU tests; only the cp.async instructions themselves are GPU-only.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

WARPGROUP = 128
CHUNK_BYTES = 16


def swizzle_bytes(block_k: int, itemsize: int) -> int:
  """The swizzle of a gathered tile with ``block_k`` columns: the tile row's bytes up to 128."""
  row = block_k * itemsize
  sw = min(row, 128)
  if sw not in (32, 64, 128) or row % sw:
    raise ValueError(f"gather='fused' needs block_k * itemsize to be 32, 64 or a multiple of "
                     f"128 bytes, got block_k={block_k} ({row} bytes)")
  return sw


def gather_row_ok(block_k: int, itemsize: int) -> bool:
  """Whether ``issue_gather`` can copy (·, block_k) tiles: the row's bytes are 32, 64 or a
  multiple of 128 (``swizzle_bytes``) and divide one pass of 16-byte chunks over 128 threads."""
  row = block_k * itemsize
  try:
    swizzle_bytes(block_k, itemsize)
  except ValueError:
    return False
  return (WARPGROUP * CHUNK_BYTES) % row == 0


def a_transforms(block_k: int, itemsize: int):
  """SMEM transforms of a gathered (rows, block_k) tile: (8, swizzle) tiles, swizzled."""
  sw = swizzle_bytes(block_k, itemsize)
  return (plgpu.TilingTransform((8, sw // itemsize)), plgpu.SwizzleTransform(sw))


def barrier_scratch(slots: int, *, interpret: bool):
  """Scratch for one gather mbarrier per ring slot (see the module docstring)."""
  if interpret:
    return plgpu.Barrier(num_arrivals=1, num_barriers=slots)
  return plgpu.SMEM((slots, 2), jnp.int32)  # an 8-byte mbarrier per slot


def _mlir():
  # Imported lazily: jaxlib's MLIR bindings are only used when lowering for a GPU.
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, gpu, llvm, memref, nvvm
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  return ir, arith, gpu, llvm, memref, nvvm, mgpu_utils


def _barrier_ptr(bars, slot_i):
  ir, arith, _, _, _, _, mgpu_utils = _mlir()
  i8 = ir.IntegerType.get_signless(8)
  off = arith.muli(slot_i, mgpu_utils.c(8, ir.IntegerType.get_signless(32)))
  return mgpu_utils.getelementptr(mgpu_utils.memref_ptr(bars), [off], i8)


def init_barriers(bars, slots: int, *, interpret: bool) -> None:
  """Initializes the gather mbarriers for 128 arrivals each. Every thread of the CTA must call
  this (it ends with a CTA-wide barrier), before any warpgroup uses them."""
  if interpret:
    return

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
  def _init(_, bars_ref):
    ir, arith, gpu, _, _, nvvm, mgpu_utils = _mlir()
    i32 = ir.IntegerType.get_signless(32)
    first = arith.cmpi(arith.CmpIPredicate.eq, mgpu_utils.thread_idx(), mgpu_utils.c(0, i32))
    for s in range(slots):
      nvvm.mbarrier_init(_barrier_ptr(bars_ref, mgpu_utils.c(s, i32)),
                         mgpu_utils.c(WARPGROUP, i32), predicate=first)
    nvvm.fence_mbarrier_init()
    gpu.barrier()

  _init(bars)


def issue_gather(gidx_ref, lhs_ref, a_ring, bars, *, slot, row0, k0, block_m: int, block_k: int,
                 interpret: bool, valid=None) -> None:
  """Starts the copy of ``block_m`` gathered rows into ``a_ring[slot]`` (block_m, block_k); the
  slot's mbarrier completes when they have landed.

  gidx_ref: (M,) int32 GMEM; lhs_ref: (T, k) GMEM; slot, row0, k0: int32 scalars.
  valid: optional (lo, hi) int32 scalars: tile rows r with row0 + r outside [lo, hi) are
  zero-filled instead of copied (cp.async with a source size of 0), so a reduction over the
  tile's rows never sees rows of another group.
  """
  if interpret:
    for r in range(block_m):
      v = lhs_ref[gidx_ref[row0 + r], pl.ds(k0, block_k)]
      if valid is not None:
        keep = (row0 + r >= valid[0]) & (row0 + r < valid[1])
        v = jnp.where(keep, v, jnp.zeros_like(v))
      a_ring[slot, r, :] = v
    plgpu.barrier_arrive(bars.at[slot])
    return
  itemsize = jnp.dtype(lhs_ref.dtype).itemsize
  sw = swizzle_bytes(block_k, itemsize)
  col_tiles = block_k * itemsize // sw  # (8, swizzle) tiles side by side in a tile row band
  chunks_per_swz = sw // CHUNK_BYTES
  chunks_per_row = col_tiles * chunks_per_swz
  if WARPGROUP % chunks_per_row:
    raise ValueError(f"block_k * itemsize ({block_k * itemsize} bytes) must divide "
                     f"{WARPGROUP * CHUNK_BYTES}")
  rows_per_pass = WARPGROUP // chunks_per_row
  if block_m % rows_per_pass or block_m % 8:
    raise ValueError(f"block_m ({block_m}) must be a multiple of {max(rows_per_pass, 8)}")
  slot_bytes = block_m * block_k * itemsize
  elems_per_chunk = CHUNK_BYTES // itemsize
  layout = plgpu.Layout.WG_SPLAT
  n_valid = 0 if valid is None else 2

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(),
                                plgpu.RefType(a_transforms(block_k, itemsize)), plgpu.RefType(),
                                *([layout] * (3 + n_valid))))
  def _issue(_, gidx, lhs, ring, bars_ref, slot_v, row0_v, k0_v, *valid_v):
    ir, arith, _, llvm, memref, nvvm, mgpu_utils = _mlir()
    i8 = ir.IntegerType.get_signless(8)
    i32 = ir.IntegerType.get_signless(32)
    i64 = ir.IntegerType.get_signless(64)
    index = ir.IndexType.get()
    c32 = lambda v: mgpu_utils.c(v, i32)
    slot_i, row0_i, k0_i = (v.registers.item() for v in (slot_v, row0_v, k0_v))
    lo_i, hi_i = (v.registers.item() for v in valid_v) if valid_v else (None, None)
    tid = arith.remui(mgpu_utils.thread_idx(), c32(WARPGROUP))
    chunk_in_row = arith.remui(tid, c32(chunks_per_row))
    col_tile = arith.divui(chunk_in_row, c32(chunks_per_swz))
    chunk = arith.remui(chunk_in_row, c32(chunks_per_swz))
    r_base = arith.divui(tid, c32(chunks_per_row))
    k = ir.MemRefType(lhs.type).shape[1]
    elem = ir.MemRefType(lhs.type).element_type
    gmem = llvm.addrspacecast(llvm.PointerType.get(address_space=1),
                              mgpu_utils.memref_ptr(lhs))
    smem = mgpu_utils.memref_ptr(ring)
    slot_off = arith.muli(slot_i, c32(slot_bytes))
    col64 = arith.extui(i64, arith.addi(k0_i, arith.muli(chunk_in_row, c32(elems_per_chunk))))
    swz_mask = c32(chunks_per_swz - 1)
    passes = block_m // rows_per_pass
    # All index loads first, so their latencies overlap instead of serializing with the copies.
    rows = [arith.addi(r_base, c32(p * rows_per_pass)) for p in range(passes)]
    src_rows = [memref.load(gidx, [arith.index_cast(index, arith.addi(row0_i, r))])
                for r in rows]
    for r, src_row in zip(rows, src_rows):
      g_off = arith.addi(arith.muli(arith.extui(i64, src_row), mgpu_utils.c(k, i64)), col64)
      g_ptr = mgpu_utils.getelementptr(gmem, [g_off], elem)
      # Tiled layout (rows / 8, col_tiles, 8, swizzle): the (8, swizzle) tile of (r, col_tile),
      # then row r % 8 of it, whose 16-byte chunks are permuted by the hardware swizzle.
      r8 = arith.remui(r, c32(8))
      tile = arith.addi(arith.muli(arith.divui(r, c32(8)), c32(col_tiles)), col_tile)
      swz = arith.andi(arith.shrui(arith.muli(r8, c32(sw)), c32(7)), swz_mask)
      s_off = arith.addi(
          arith.addi(slot_off, arith.addi(arith.muli(tile, c32(8 * sw)), arith.muli(r8, c32(sw)))),
          arith.shli(arith.xori(chunk, swz), c32(4)))
      s_ptr = mgpu_utils.getelementptr(smem, [s_off], i8)
      cp_size = None
      if lo_i is not None:  # source size 0 outside [lo, hi): the chunk is zero-filled
        g_row = arith.addi(row0_i, r)
        inside = arith.andi(arith.cmpi(arith.CmpIPredicate.sge, g_row, lo_i),
                            arith.cmpi(arith.CmpIPredicate.slt, g_row, hi_i))
        cp_size = arith.select(inside, c32(CHUNK_BYTES), c32(0))
      nvvm.cp_async_shared_global(s_ptr, g_ptr, CHUNK_BYTES, nvvm.LoadCacheModifierKind.CG,
                                  cp_size=cp_size)
    nvvm.cp_async_mbarrier_arrive(_barrier_ptr(bars_ref, slot_i), noinc=True)

  _issue(gidx_ref, lhs_ref, a_ring, bars, slot, row0, k0, *(() if valid is None else valid))


def wait_gathered(bars, *, slot, parity, interpret: bool) -> None:
  """Waits until the gather into ``slot`` with phase ``parity`` (use count of the slot mod 2)
  has landed, then fences the generic proxy against the async proxy for shared memory."""
  if interpret:
    plgpu.barrier_wait(bars.at[slot])
    return
  layout = plgpu.Layout.WG_SPLAT

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), layout, layout))
  def _wait(_, bars_ref, slot_v, parity_v):
    ir, _, _, _, _, nvvm, mgpu_utils = _mlir()
    i32 = ir.IntegerType.get_signless(32)
    nvvm.mbarrier_try_wait_parity(_barrier_ptr(bars_ref, slot_v.registers.item()),
                                  parity_v.registers.item(), mgpu_utils.c(10_000_000, i32))
    nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)

  _wait(bars, slot, parity)


def ring_slot(g, slots: int, base=0):
  """The slot of step ``g`` of a ring of ``slots`` stages, g % slots, offset by ``base``: the
  ring's first slot in barrier and SMEM arrays that hold several rings side by side (a
  Python 0, the single-ring case, adds no operation)."""
  slot = lax.rem(g, slots)
  return slot if isinstance(base, int) and base == 0 else base + slot


def wait_stage(full, full_gathered, *, g, slots: int, interpret: bool, base=0):
  """Consumer side of step ``g`` of a cross-tile ring of ``slots`` stages: waits for the stage's
  TMA barrier ``full`` and, when it also holds gathered rows (``full_gathered`` not None), for
  their cp.async barrier (phase parity (g // slots) % 2). Returns the slot, g % slots.

  base: the ring's first slot in the barrier and SMEM arrays, for a kernel holding several
  rings side by side (then the slot returned is base + g % slots; ``ring_slot``)."""
  slot = ring_slot(g, slots, base)
  plgpu.barrier_wait(full.at[slot])
  if full_gathered is not None:
    wait_gathered(full_gathered, slot=slot, parity=lax.rem(g // slots, 2), interpret=interpret)
  return slot


def drain_releases(empty, total, slots: int, base=0) -> None:
  """Producer side, after its last step: observes the consumers' releases of the last
  ``slots`` stages of a ring that ran ``total`` steps, so every barrier phase has been awaited
  when the barriers are freed (the interpreter checks this). base: as in ``wait_stage``."""
  @pl.loop(jnp.maximum(total - slots, 0), total)
  def _released(g):
    plgpu.barrier_wait(empty.at[ring_slot(g, slots, base)])


# Two ping-pong consumers on one shared ring take the CTA's items in turn (item j to consumer
# j % 2), each skipping the other's. ``turn`` is a pair of one-arrival Pallas barriers: consumer
# w waits on turn[w] before each of its items but the first, and the other consumer arrives
# there once every wgmma of its previous item is issued. So a consumer starts waiting on its
# next item's stages only after the other has waited on every stage of the item between, and
# no full barrier is waited on two phases behind, where the older phase's parity would pass.


def check_shared_ring_steps(k_steps: int, stages: int, needs: str) -> None:
  """ValueError unless each item's ``k_steps`` ring steps use every one of the shared ring's
  ``stages`` slots an even number of times, which a consumer skipping the item needs (Mosaic GPU
  tracks a barrier's phase by counting the waiting thread's own waits). ``needs`` opens the
  message up to the step count, e.g. "...needs d / block_k (1536 / 32"."""
  if k_steps % (2 * stages):
    raise ValueError(f"{needs} = {k_steps}) to be a multiple of 2 x max_concurrent_steps "
                     f"({2 * stages}): a consumer skips the other's items, which must use every "
                     "ring slot an even number of times")


def turn_wait(turn, wg, item) -> None:
  """Consumer ``wg`` before CTA item ``item`` (its own): the other consumer issued item - 1."""
  @pl.when(item > 0)
  def _():
    plgpu.barrier_wait(turn.at[wg])


def turn_arrive(turn, wg) -> None:
  """Consumer ``wg`` once every wgmma of its item is issued: the other's turn."""
  plgpu.barrier_arrive(turn.at[1 - wg])


def turn_drain(turn, wg, items) -> None:
  """Consumer ``wg`` after the CTA's ``items`` items: the last item's arrival has no item of
  the other consumer to wait for it (turn[w] gets one more arrival than waits where
  items % 2 == w), so consumer w awaits it here and every phase is awaited before the barriers
  are freed."""
  @pl.when((items > 0) & (lax.rem(items, 2) == wg))
  def _():
    plgpu.barrier_wait(turn.at[wg])
