"""Down-projection backward (dH) as a Pallas Mosaic GPU varlen-M grouped GEMM, Hopper.

For every grouped row p of expert e (spec §4, SonicMoE's minimal-activation backward):

  dA'[p] = dO[gather_idx[p]] · W2[e]ᵀ                       (fp32 accumulator, never stored)
  A[p]   = silu(H_gate[p]) · H_up[p]                        (recomputed from H in the epilogue)
  dS[p]  = Σ_j dA'[p, j] · A[p, j]                          (fp32)
  dH[p]  = s_p · dSwiGLU(dA'[p]) in concat layout            (h.dtype)
  A'[p]  = s_p · A[p]                                       (h.dtype, the dW2 operand)

M tiles are block-aligned (tile rows [b·block_m, (b+1)·block_m) of the grouped order) and one
tile is emitted per (block, expert) intersection, with its metadata (expert, block, first and
last valid row) computed in JAX (``tiles.make_tiles(align=block_m)``, shared with the forward
GEMMs), so no kernel loops over experts. Aligned starts are required: Mosaic GPU's TMA into
tiled/swizzled SMEM (the wgmma operand layout) needs GMEM row starts divisible by the SMEM
tiling, so group-start tiles do not lower on Hopper ("prove the divisibility of index 0").
Rows of a tile outside its expert are computed (wasted) but never stored: row-ragged TMA stores
go through a power-of-two ladder of static-size descriptors. dS is reduced per (M tile, N tile)
in registers and written as full per-tile partial rows, then summed over N tiles in JAX:
deterministic and free of atomics.

dH is written over H in place: H is passed as a mutable ref (``jax.new_ref``), which
lowers to an operand-output alias of the custom call, so H and dH never occupy two (P, 2n)
buffers (H is dead after dh; where a caller still holds it, XLA copies first). Safe because
tile (block, expert, N block) reads the H gate/up columns of its N block only and writes dH to
exactly those columns, on its own expert's rows: a row is written by the one tile that treats it
as valid; another tile of a straddled block may read dH there instead of H, but only into rows
it masks (never stored, their dS partials never selected).

The dO gather is an XLA gather feeding the kernel (``DhConfig(gather="xla")``; the kernel's lhs
is the gathered (P, d) matrix) or, with ``gather="fused"`` (what ``backward_gathers="auto"``
picks at n = 256 and at n = 512 with d >= 4096), the rows dout[gather_idx[p]] read inside the
kernel: a producer warpgroup issues the W2 tiles by TMA and the dO rows by cp.async
(``cp_async.py``, as up_proj's fused gather) into a ring that runs across tiles, and one
consumer warpgroup runs the wgmma and the same epilogue; no (P, d) gathered copy exists in HBM.
``ring=True`` runs that kernel on XLA's gathered dO with both operands by TMA (the next tile's
loads overlap this tile's epilogue); ``num_consumers=2`` splits each tile's rows between two
consumer warpgroups, which on a 128 x 256 CTA tile (64 x 256 per consumer) with
``h_source="gmem"`` (H read from HBM into registers in the epilogue, no SMEM for it) and two
staging buffers is the default at d >= 1536; ``consumer_split="n"`` puts them side by side
instead (128 x 128 each). With a short K loop (d <= 1536) the default runs two CTAs per SM
(``ctas_per_sm``) so one CTA's epilogue overlaps the other's K loop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sonic_jax.pallas import cp_async
from sonic_jax.pallas import tiles as tiles_lib
from sonic_jax.pallas.grid import (CLUSTER_AXIS, cluster_kwargs, cluster_rank, multicasts,
                                   persistent_ctas, release_barrier)
from sonic_jax.pallas.grouped_gemm import (_PRODUCER_REGS, _consumer_regs, staging_smem,
                                           staging_views)
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
  ctas_per_sm: CTAs per SM of the persistent grid (num_sms · ctas_per_sm CTAs). 2 lets one
  CTA's epilogue run while the other's K loop does, where the default kernel's SMEM fits twice
  (``smem_bytes``: e.g. 64-column n tiles with 3 stages, 104.5 KiB).
  gather: where the dO rows are gathered: "xla" (an XLA gather before the kernel, the default)
  or "fused" (cp.async inside the kernel, a producer warpgroup + one consumer warpgroup; what
  ``PallasKernels(backward_gathers="auto")`` runs at n = 256 and at n = 512 with d >= 4096;
  docs/pallas-backward.md has its H200 timings). With "fused", max_concurrent_steps is
  the depth of the cross-tile ring (>= 2) and the output tiles are staged one epi_n chunk at a
  time (``smem_bytes``); block_k * 2 bytes must be 32, 64 or a multiple of 128 dividing 2048 (the
  gathered tile's swizzle).
  ring: with gather="xla", run the fused path's warp-specialized kernel (a producer warpgroup,
  one consumer, a ring of max_concurrent_steps >= 2 stages across tiles, one staged epi_n output
  chunk) with both operands by TMA, so the next tile's loads overlap this tile's epilogue;
  gather="fused" always runs it. False: one warpgroup whose K pipeline restarts per tile.
  num_consumers: consumer warpgroups of that kernel (1 or 2). 2 splits each tile's rows between
  them (block_m / 2 = 64 each: m64 wgmmas, half the epilogue each, run side by side).
  consumer_split: how two consumers share a CTA tile. "m" (above): block_m x block_n split by
  rows. "n": each owns block_n columns of all block_m rows, so the CTA tile is block_m x
  2·block_n and the dO tile is loaded once for both (128 x 256 at block_n 128: 85 FLOP per byte
  of L2 traffic per K step against 64 for 128 x 128).
  h_source: where the ring kernel's epilogue reads H. "smem": TMA-prefetched gate/up tiles
  (2·block_m·block_n elements per consumer, loaded during the K loop). "gmem": loaded from HBM
  straight into the WGMMA register layout one epi_n chunk at a time (no SMEM, so a 128 x 256
  CTA tile fits with its ring; the latency is exposed unless h_prefetch). P not a multiple of
  block_m pads a copy of H (the last tile's rows must be readable).
  h_prefetch: with h_source="gmem", issue the loads of the first epilogue chunk's H before the
  K loop (their latency hides under it; the values hold 2·bm_wg·epi_n/128 bf16 registers per
  thread across the loop) and those of chunk c + 1 when chunk c starts. Slower on the H200
  (session 11, 120B-n1024: 7.14 ms on the side-by-side tile, 4.90 on the row-split one, against
  4.95 / 4.73 without), presumably from the registers it holds across the K loop.
  h_lookahead: with h_source="gmem", issue chunk 0's H loads after the K loop's last wgmma
  (not before the loop, so no registers are held across it) and chunk c + 1's when chunk c
  starts: one chunk's latency in flight under the math of the one before. Opt-in: slower on
  the H200 (session 14, dh kernel on the default 128 x 256 tile: 4.84 vs 4.62 ms at T=32768,
  d=4096, n=1024, E=128, K=8; 0.528 vs 0.498 at T=24576, d=1536, n=256; a tie at d=7168).
  epi_buffers: SMEM staging buffers (bm_wg x epi_n each) per consumer of the ring kernel for the
  three outputs of an epilogue chunk (dH gate, dH up, A'). 3: written together, then stored;
  1 or 2: each output stored as soon as written, reusing a buffer once its store has read it,
  which leaves SMEM for a deeper ring.
  epilogue_swizzle: each output staging buffer is a union of an untiled view (for the ragged
  row ladder) and a swizzled (8, epi_n)-tiled view of the same bytes. A warpgroup whose rows of
  the tile (bm_wg on the ring kernel, block_m otherwise) are all valid (the common case)
  writes the WGMMA-layout registers through the swizzled view, free of the bank conflicts of
  128-byte untiled rows, and stores each output with one TMA; ragged ones keep the ladder.
  Aimed at short K loops (small d), where the epilogue dominates a tile.
  pipelines: (ring kernel, one consumer) consumer warpgroups in one CTA, each with its own
  ring of max_concurrent_steps stages and taking every pipelines-th work item of the CTA, fed
  by one producer in item order, so one consumer's epilogue runs while the other's wgmmas do
  (a ping-pong by rings: the consumers of a shared ring would have to skip each other's
  stages, which Pallas barriers' per-thread phase tracking cannot). 2: three warpgroups,
  registers 40 for the producer and 232 per consumer thread. (A producer per pipeline, four
  warpgroups, capped every thread at 128 registers: ptxas failed on 64 x 256 and 128 x 128
  ran 44 % slower at d = 768.) Opt-in and slower on the H200 (session 14, dh kernel, block_k 32,
  4 stages per ring, H from HBM, against the default): 64 x 256 0.611 vs 0.565 ms at T=40960,
  d=768, n=512, E=64, K=4 and 6.83 vs 4.60 ms at T=32768, d=4096, n=1024, E=128, K=8; 128 x 128
  0.774 / 7.11 ms. Each consumer's wgmmas run alone, one 64- or 128-row tile at a time.
  pipeline_ring: with pipelines = 2, "split" (the above: a ring per consumer) or "shared"
  (session 32; correct on the H100, slower than the heuristic): one ring of max_concurrent_steps
  stages for both consumers, which take the CTA's items in turn (item j to consumer j % 2),
  each skipping the other's items, their mainloops ordered by two turn barriers, as
  grouped_gemm's ``wg_split="pingpong"`` (docs/pallas-forward.md): the running consumer has
  every stage. Needs d / block_k a multiple of 2 x max_concurrent_steps (a skipped item must
  use every slot an even number of times: Pallas tracks barrier phases per waiting thread).
  The interpreter, which forbids the skipped phases, runs it as "split".
  cluster_m: 1, or 2 for 2-CTA clusters on the ring kernel (one pipeline, one CTA per SM), as
  ``GemmConfig.cluster_m``: neighbouring M tiles of one expert (``make_tiles(pair=True)``) in
  the two CTAs of a cluster, the W2 tile by TMA multicast, the slots released through a
  ClusterBarrier (in the interpreter: pair tiles and the cluster grid, no multicast). Session
  17: not yet run on a GPU.
  """

  @property
  def warp_specialized(self) -> bool:
    """Whether the cross-tile ring kernel runs (gather="fused", or ring=True)."""
    return self.gather == "fused" or self.ring

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 8
  epi_n: int = 64
  num_sms: int | None = None
  gather: Literal["xla", "fused"] = "xla"
  ring: bool = False
  ctas_per_sm: int = 1
  num_consumers: int = 1
  consumer_split: Literal["m", "n"] = "m"
  h_source: Literal["smem", "gmem"] = "smem"
  epi_buffers: int = 3
  h_prefetch: bool = False
  h_lookahead: bool = False
  epilogue_swizzle: bool = False
  pipelines: int = 1
  cluster_m: int = 1
  pipeline_ring: Literal["split", "shared"] = "split"

  @property
  def block_n_cta(self) -> int:
    """Columns of n per CTA tile (2·block_n with consumer_split="n")."""
    return self.block_n * (self.num_consumers if self.consumer_split == "n" else 1)

  def __post_init__(self):
    for f in ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n", "epi_n",
              "ctas_per_sm"):
      v = getattr(self, f)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DhConfig.{f} must be a positive int, got {v!r}")
    if self.block_m % 64:
      raise ValueError(f"DhConfig.block_m must be a multiple of 64, got {self.block_m}")
    # epi_n = 32 (64-byte rows, 64-byte swizzle) crashed on H200 with a misaligned address.
    if self.block_n % self.epi_n or self.epi_n % 64:
      raise ValueError(
          f"DhConfig.epi_n must be a multiple of 64 dividing block_n ({self.block_n}), got "
          f"{self.epi_n}")
    if self.gather not in ("xla", "fused"):
      raise ValueError(f"DhConfig.gather must be 'xla' or 'fused', got {self.gather!r}")
    if self.gather == "fused":
      # Operands are 2-byte (bf16 / f16). cp_async.issue_gather copies a tile row as 16-byte
      # chunks spread over the 128 producer threads, into (8, swizzle)-tiled SMEM.
      row = self.block_k * 2
      try:
        cp_async.swizzle_bytes(self.block_k, 2)
      except ValueError:
        raise ValueError(
            f"DhConfig.block_k with gather='fused' needs block_k * 2 bytes to be 32, 64 or a "
            f"multiple of 128, got block_k={self.block_k} ({row} bytes)") from None
      if (cp_async.WARPGROUP * cp_async.CHUNK_BYTES) % row:
        raise ValueError(
            f"DhConfig.block_k with gather='fused' needs block_k * 2 bytes to divide "
            f"{cp_async.WARPGROUP * cp_async.CHUNK_BYTES}, got block_k={self.block_k}")
    if self.num_consumers not in (1, 2):
      raise ValueError(f"DhConfig.num_consumers must be 1 or 2, got {self.num_consumers!r}")
    if self.num_consumers == 2 and (
        not self.warp_specialized or (self.consumer_split == "m" and self.block_m != 128)):
      raise ValueError(f"DhConfig.num_consumers = 2 needs the ring kernel (gather='fused' or "
                       f"ring=True) and, splitting rows (consumer_split='m'), block_m = 128, got "
                       f"gather={self.gather!r}, ring={self.ring}, block_m={self.block_m}")
    if self.consumer_split not in ("m", "n"):
      raise ValueError(f"DhConfig.consumer_split must be 'm' or 'n', got {self.consumer_split!r}")
    if self.h_source not in ("smem", "gmem"):
      raise ValueError(f"DhConfig.h_source must be 'smem' or 'gmem', got {self.h_source!r}")
    if self.epi_buffers not in (1, 2, 3):
      raise ValueError(f"DhConfig.epi_buffers must be 1, 2 or 3, got {self.epi_buffers!r}")
    if self.h_lookahead and (self.h_source != "gmem" or self.h_prefetch):
      raise ValueError("DhConfig.h_lookahead needs h_source = 'gmem' and h_prefetch = False "
                       "(h_prefetch already issues each chunk's loads ahead)")
    if self.h_prefetch and self.h_source != "gmem":
      raise ValueError("DhConfig.h_prefetch needs h_source = 'gmem' (the SMEM H tiles are "
                       "prefetched by TMA already)")
    if self.pipelines not in (1, 2):
      raise ValueError(f"DhConfig.pipelines must be 1 or 2, got {self.pipelines!r}")
    if self.pipeline_ring not in ("split", "shared"):
      raise ValueError(f"DhConfig.pipeline_ring must be 'split' or 'shared', got "
                       f"{self.pipeline_ring!r}")
    if self.pipeline_ring == "shared" and self.pipelines != 2:
      raise ValueError(f"DhConfig.pipeline_ring = 'shared' needs pipelines = 2, got "
                       f"{self.pipelines}")
    if self.pipelines == 2 and (not self.warp_specialized or self.num_consumers != 1):
      raise ValueError(f"DhConfig.pipelines = 2 needs the ring kernel (gather='fused' or "
                       f"ring=True) with num_consumers = 1, got gather={self.gather!r}, "
                       f"ring={self.ring}, num_consumers={self.num_consumers}")
    if self.h_source == "gmem" and not self.warp_specialized:
      raise ValueError("DhConfig.h_source = 'gmem' needs the ring kernel (gather='fused' or "
                       "ring=True)")
    if self.cluster_m not in (1, 2):
      raise ValueError(f"DhConfig.cluster_m must be 1 or 2, got {self.cluster_m!r}")
    if self.cluster_m == 2 and not (self.warp_specialized and self.pipelines == 1
                                    and self.ctas_per_sm == 1):
      raise ValueError(f"DhConfig.cluster_m = 2 needs the ring kernel (gather='fused' or "
                       f"ring=True) with pipelines = 1 and ctas_per_sm = 1, got "
                       f"gather={self.gather!r}, ring={self.ring}, pipelines={self.pipelines}, "
                       f"ctas_per_sm={self.ctas_per_sm}")
    if self.warp_specialized and self.max_concurrent_steps < 2:
      raise ValueError(f"DhConfig.max_concurrent_steps must be >= 2 with gather='fused' or "
                       f"ring=True (the consumer frees a stage one step late), got "
                       f"{self.max_concurrent_steps}")


def dh_config_for(d: int, n: int, *, gather: Literal["xla", "fused"] = "xla") -> DhConfig:
  """Default tiling for shape (d, n): 128-column n tiles when n allows, else 64.

  Session 13 (kernel-profile-h200-2026-12-04-s13.md, dh kernel inside the layer step): the
  swizzled staging (``epilogue_swizzle``) on every row-split ring tile below, and at d < 1536
  with n % 128 == 0 the row-split ring on a 128 x 128 tile with H TMA-prefetched into SMEM:
  T=40960, d=768: 0.561 against 0.613 ms (two CTAs per SM) at n=512, 0.519 against 0.613 at
  n=1024; with the swizzle alone the two-CTA kernel ran 0.619 and the 128 x 256 ring tile 0.609.
  The swizzle on the 128 x 256 tiles: 0.598 against 0.663 ms (in-kernel gather, d=768, n=256),
  0.497 against 0.539 (d=1536, n=256), 0.485 against 0.505 (XLA gather, d=1536, n=512).

  gather="xla" with d <= 1536 (where the rules below do not apply): 64-column n tiles, 3
  stages, two CTAs per SM. With a short K loop (d / 64 steps) the serial epilogue (H in, dH
  and A' out) dominates a tile, and a second resident CTA overlaps it (H200, layer step, dh kernel alone: d=768, n=512 0.750 -> 0.632 ms;
  d=1536, n=512 0.592 -> 0.541 ms; at d=4096 it lost: n=1024 2.53 -> 2.94 ms, 5.44 -> 5.91 ms;
  benchmarks/results/kernel-profile-h200-2026-12-04-s9-2cta.md).

  gather="xla" with d >= 1536 and n % 256 == 0: the ring kernel on a 128 x 256 CTA tile whose
  two consumers split the rows (64 x 256 each, m64n256 wgmmas), H read from HBM into registers,
  two staging buffers, 6 stages of block_k 32. H200, dh kernel alone, session 11
  (kernel-profile-h200-2026-12-04-s11.md), against session 10's default at d >= 4096 (the same
  tile with the consumers side by side, 128 x 128 each) and the one-warpgroup 128 x 128 kernel
  at d = 2048: 4.73 / 4.95 ms at T=32768, d=4096, n=1024, E=128, K=8; 2.30 / 2.50 ms at E=64,
  K=4; 1.48 / 1.72 ms at T=16384, d=2048, n=1024, E=64, K=8; 1.14 / 1.37 ms at n=768, E=128;
  against the two-CTA kernel below: 0.503 / 0.541 ms at T=24576, d=1536, n=512, E=64, K=4, and
  a tie at d=768 (0.630 / 0.634 ms, T=40960, n=512), which keeps the two-CTA kernel.
  Issuing the H loads ahead of the epilogue (h_prefetch) lost on both tiles.

  gather="fused" with d >= 768 and n % 256 == 0: the same row-split 128 x 256 tile as above
  with the dO rows gathered by the producer's cp.async. H200, dh kernel / layer step against
  the one-consumer 128 x 128 tile below: session 11, T=32768, d=4096, n=512, E=256, K=16
  (kernel-profile-h200-2026-12-04-s11.md): 4.86 / 41.24 against 9.06 / 43.85 ms; session 12
  (kernel-profile-h200-2026-12-04-s12-n256.log), n=256, E=128, K=8: T=40960, d=768 0.664 /
  3.339 against 1.045 / 3.723 ms; T=24576, d=1536 0.543 / 3.719 against 0.900 / 4.078 ms
  (3 stages of block_k 64 the same to 0.3 %).
  gather="fused" otherwise: the 128-column tiles with the deepest ring (<= 4) that fits the SMEM
  next to the H tiles and one staged output chunk (3 stages at 128x128x64; H200, T=32768,
  d=4096, n=1024, E=128, K=8: 6.73-6.82 ms against 6.50 ms for the XLA gather + kernel, session
  5)."""
  block_n = 128 if n % 128 == 0 else 64
  config = DhConfig(block_n=block_n, epi_n=min(64, block_n))
  # The row-split ring tiles: two consumers of 64 rows each, 6 stages of block_k 32, two
  # staging buffers written through the swizzled view on full row windows.
  rows_split = dict(block_k=32, epi_n=64, max_concurrent_steps=6, num_consumers=2,
                    consumer_split="m", epi_buffers=2, epilogue_swizzle=True)
  if gather == "xla":
    if d >= 1536 and n % 256 == 0:
      return DhConfig(block_n=256, ring=True, h_source="gmem", **rows_split)
    if d < 1536 and n % 128 == 0:
      return DhConfig(block_n=128, ring=True, h_source="smem", **rows_split)
    if d <= 1536:
      return DhConfig(block_n=64, epi_n=64, max_concurrent_steps=3, ctas_per_sm=2)
    return config
  if d >= 768 and n % 256 == 0:
    return DhConfig(block_n=256, gather="fused", h_source="gmem", **rows_split)
  for steps in (4, 3, 2):
    fused = dataclasses.replace(config, gather="fused", max_concurrent_steps=steps)
    if smem_bytes(fused) <= SMEM_LIMIT:
      return fused
  return dataclasses.replace(config, gather="fused", max_concurrent_steps=2)


def interpret_params(interpret):
  """``interpret`` (bool or InterpretGPUParams) -> the kernel's ``interpret`` argument."""
  if not interpret:
    return False
  if isinstance(interpret, plgpu.InterpretGPUParams):
    return interpret
  # Tiles may read past the last row (the GPU's TMA zero-fills there); the interpreter returns
  # NaN for such reads, which only ever lands in rows that are not stored or are masked.
  return plgpu.InterpretGPUParams(out_of_bounds_reads="uninitialized")


def _store_rows(src_smem, dst_gmem, row0, lo, cols, num_rows, max_rows: int):
  """TMA-stores src_smem[lo:lo + num_rows] to dst_gmem[row0 + lo:row0 + lo + num_rows, cols].

  num_rows is traced (<= max_rows) but TMA boxes are static, so a ladder of power-of-two
  descriptors covers any row count (the scheme of jax's ragged_dot_mgpu epilogue).
  """
  offset = lo
  size = 1 << int(math.log2(max_rows))
  while size >= 1:
    @pl.when((num_rows & size) != 0)
    def _(size=size, offset=offset):
      plgpu.copy_smem_to_gmem(src_smem.at[pl.ds(offset, size)],
                              dst_gmem.at[pl.ds(row0 + offset, size), cols])
    offset = offset + (num_rows & size)
    size //= 2


def _epilogue_chunk(da, gate, up, s, ds, dtype, emit):
  """One epi_n-column chunk of the epilogue, in the WGMMA register layout.

  da, gate, up: fp32 (bm, epi_n); s: (bm,) fp32 scores (WGMMA.reduce(1)); emit(i, value) takes
  output i (0 dH_gate, 1 dH_up, 2 A', each (bm, epi_n) ``dtype`` in the WGMMA layout) as soon as
  it is computed. ds: the dS row partial of the previous chunks (None for the first); returns it
  plus this chunk's Σ_j dA'·A (fp32, (bm,))."""
  bm, epi_n = da.shape
  wgmma = plgpu.Layout.WGMMA
  sig = 1.0 / (1.0 + jnp.exp(-gate))
  silu = gate * sig
  a = silu * up
  part = jnp.sum(da * a, axis=1)
  ds = part if ds is None else ds + part
  s_b = lax.broadcast_in_dim(s, (bm, epi_n), [0])
  ds_b = da * s_b
  emit(0, plgpu.layout_cast((ds_b * up * sig * (1.0 + gate * (1.0 - sig))).astype(dtype), wgmma))
  emit(1, plgpu.layout_cast((ds_b * silu).astype(dtype), wgmma))
  emit(2, plgpu.layout_cast((a * s_b).astype(dtype), wgmma))
  return ds


def _on_staging_view(untiled, swizzled, full, fn) -> None:
  """Runs ``fn(view, full_window)`` on the staging view a window's stores take: with
  ``epilogue_swizzle`` (``swizzled`` not None) the swizzled view where ``full`` (traced: every
  row of the window valid, stored by one TMA per output) and the untiled one elsewhere (the
  ragged ladder slices it at any row); without it always the untiled one (``full`` unused)."""
  if swizzled is None:
    fn(untiled, False)
    return
  pl.when(full)(lambda: fn(swizzled, True))
  pl.when(jnp.logical_not(full))(lambda: fn(untiled, False))


def _collect(values: list):
  """emit for ``_epilogue_chunk`` that keeps output i in ``values[i]`` (written later)."""
  def emit(i, value):
    values[i] = value
  return emit


def _write_all(refs, c, values):
  """Writes output i's chunk ``values[i]`` to ``refs[i].at[c]`` (chunked staging buffers)."""
  for ref, v in zip(refs, values):
    ref.at[c][...] = v


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
  validate_dh_shapes(d, n, config)


SMEM_LIMIT = 220 * 1024  # of the 227 KiB a Hopper CTA can use; the rest for barriers
SM_SMEM = 228 * 1024  # one Hopper SM's shared memory, 1 KiB of it reserved per resident CTA


def smem_bytes(config: DhConfig, itemsize: int = 2) -> int:
  """SMEM of one CTA: the prefetched H gate/up tiles and scores stay live over the K loop's
  pipeline ring, whose space the three output tiles and the dS row reuse afterwards.

  gather="fused" or ring=True: the ring runs across tiles (the producer fills the next tile's
  stages during this tile's epilogue), so nothing is reused: the ring + per consumer its H
  tiles (none with h_source="gmem"), scores, epi_buffers staging buffers of one epi_n chunk and
  the dS row; all of it once per pipeline."""
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  h_tiles = 2 * bm * bn * itemsize + bm * 4
  ring = config.max_concurrent_steps * (bm * bk + config.block_n_cta * bk) * itemsize
  if config.warp_specialized:
    # Per consumer: its H tiles (bm_wg x block_n, unless read from HBM), scores, the staging
    # buffers (bm_wg x epi_n each) and the dS row.
    wgs = config.num_consumers
    bm_wg = bm if config.consumer_split == "n" else bm // wgs
    h_wg = 2 * bm_wg * bn * itemsize if config.h_source == "smem" else 0
    staged = config.epi_buffers * bm_wg * config.epi_n * itemsize
    rings = 1 if config.pipeline_ring == "shared" else config.pipelines
    return rings * ring + config.pipelines * wgs * (h_wg + bm_wg * 4 + staged + bm_wg * 4)
  outputs = 3 * bm * bn * itemsize + bm * 4
  return h_tiles + max(ring, outputs)


def validate_dh_shapes(d: int, n: int, config: DhConfig) -> None:
  """Raises ValueError when (d, n) cannot be tiled by ``config`` (the shape rules alone)."""
  if d % config.block_k:
    raise ValueError(f"d ({d}) must be a multiple of DhConfig.block_k ({config.block_k})")
  if n % config.block_n:
    raise ValueError(f"n ({n}) must be a multiple of DhConfig.block_n ({config.block_n})")
  if n % config.block_n_cta:
    raise ValueError(f"n ({n}) must be a multiple of the dh CTA tile's columns "
                     f"({config.block_n_cta} = {config.num_consumers} consumers side by side "
                     f"(consumer_split='n') x DhConfig.block_n {config.block_n})")
  if config.pipeline_ring == "shared":
    cp_async.check_shared_ring_steps(
        d // config.block_k, config.max_concurrent_steps,
        f"DhConfig.pipeline_ring = 'shared' needs d / block_k ({d} / {config.block_k}")
  if smem_bytes(config) > SMEM_LIMIT:
    raise ValueError(f"DhConfig {config} needs {smem_bytes(config)} bytes of SMEM, more than "
                     f"{SMEM_LIMIT}: lower max_concurrent_steps, block_k or block_n")
  per_sm = config.ctas_per_sm * (smem_bytes(config) + 1024 + 1024)  # + barriers, reserved
  if per_sm > SM_SMEM:
    raise ValueError(f"DhConfig.ctas_per_sm = {config.ctas_per_sm} needs {per_sm} bytes of SMEM "
                     f"per SM, more than {SM_SMEM}: lower ctas_per_sm, block_n or "
                     f"max_concurrent_steps")


def dh(dout: jax.Array, w2: jax.Array, h: jax.Array, scores_grouped: jax.Array,
       plan: RoutingPlan, *, config: DhConfig | None = None, interpret=False,
       dout_gathered: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """dH / A' / dS of the down projection.

  dout (T, d), w2 (E, n, d), h (P, 2n) concat layout, scores_grouped (P,) fp32.
  dout_gathered: optional (P, d) = dout[plan.gather_idx] when the caller already has it; not
  allowed with ``config.gather == "fused"`` (which reads dout's rows in the kernel): ValueError.
  Returns dH (P, 2n) h.dtype, A' (P, n) h.dtype, dS (P,) fp32 (0 on padding rows), grouped order.
  """
  config = config or dh_config_for(jnp.shape(dout)[-1], (jnp.shape(w2) + (0, 0))[1])
  validate_dh_args(dout, w2, h, scores_grouped, plan, config)
  if config.gather == "fused":
    if dout_gathered is not None:
      raise ValueError("dout_gathered must be None with DhConfig(gather='fused'): the kernel "
                       "gathers the rows of dout itself")
    return _dh_ring(dout, w2, h, scores_grouped, plan, config, interpret)
  num_experts, n, d = w2.shape
  p_rows = plan.capacity
  lhs = dout[plan.gather_idx] if dout_gathered is None else dout_gathered
  if lhs.shape != (p_rows, d):
    raise ValueError(f"dout_gathered must have shape (P, d) = {(p_rows, d)}, got {lhs.shape}")
  if config.ring:
    return _dh_ring(lhs, w2, h, scores_grouped, plan, config, interpret, pregathered=True)
  bm, bn, bk, epi_n = config.block_m, config.block_n, config.block_k, config.epi_n
  dtype = h.dtype
  # Block-aligned tiles (align = block_m): tile i computes rows [load, load + bm) (the lhs
  # block load // bm; the last block may run past P and is never stored) and stores
  # [dst, dst + rows).
  tiles = tiles_lib.make_tiles(plan.group_sizes, plan.group_offsets, block_m=bm, align=bm,
                               capacity=p_rows)
  tiles_max = tiles.expert.shape[0]
  grid_n = n // bn
  scores_grouped = scores_grouped.astype(_F32)

  # Explicit SMEM layouts for the H tiles (TMA in, WGMMA-layout loads out): annotations keep
  # Mosaic's layout-inference search small.
  swizzle = plgpu.find_swizzle(epi_n * jnp.dtype(dtype).itemsize * 8)
  h_transforms = (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
                  plgpu.SwizzleTransform(swizzle))

  def body(meta_gmem, lhs_gmem, w2_gmem, h_gmem, s_gmem, ap_gmem, dsp_gmem):
    dh_gmem = h_gmem  # dH overwrites H in place (module docstring)
    @plgpu.nd_loop((tiles_max * grid_n,), collective_axes="sm")
    def _(loop_info: plgpu.NDLoopInfo):
      mi, ni = plgpu.planar_snake(loop_info.index[0], (tiles_max, grid_n), 1,
                                  config.grid_block_n)

      def epilogue(acc, gate_smem, up_smem, s_smem, barriers, *, lo, rows, mi, ni, row_start):
        # Outputs are chunked (chunk, row, col) so each chunk is a whole untiled SMEM array:
        # the ragged row stores slice it at arbitrary rows. With epilogue_swizzle each is also
        # viewed swizzled, for the full tiles' conflict-free writes and one-TMA stores.
        def out_alloc():
          return staging_smem((bn // epi_n, bm, epi_n), dtype, h_transforms,
                               config.epilogue_swizzle)

        @functools.partial(pl.run_scoped, dgate_smem=out_alloc(), dup_smem=out_alloc(),
                           ap_smem=out_alloc(), ds_smem=plgpu.SMEM((bm,), _F32))
        def _(dgate_smem, dup_smem, ap_smem, ds_smem):
          for i in range(3):
            plgpu.barrier_wait(barriers.at[i])
          s = plgpu.load(s_smem, layout=plgpu.Layout.WGMMA.reduce(1))
          full = rows == bm  # then lo == 0: the whole tile is stored
          # The three outputs' untiled views and, with epilogue_swizzle, their swizzled ones.
          untiled, swizzled = zip(*(staging_views(o, config.epilogue_swizzle)
                                    for o in (dgate_smem, dup_smem, ap_smem)))
          swizzled = swizzled if config.epilogue_swizzle else None

          def write(c, values):
            _on_staging_view(untiled, swizzled, full,
                             lambda views, _: _write_all(views, c, values))

          ds = None
          # Column chunks keep only epi_n columns of gate/up/temporaries live in registers.
          wgmma = plgpu.Layout.WGMMA
          for c in range(bn // epi_n):
            cols = pl.ds(c * epi_n, epi_n)
            da = plgpu.layout_cast(acc[:, c * epi_n:(c + 1) * epi_n], wgmma)
            gate = plgpu.load(gate_smem.at[:, cols], layout=wgmma).astype(_F32)
            up = plgpu.load(up_smem.at[:, cols], layout=wgmma).astype(_F32)
            values = [None] * 3
            ds = _epilogue_chunk(da, gate, up, s, ds, dtype, _collect(values))
            write(c, values)
          ds_smem[...] = plgpu.layout_cast(ds, plgpu.Layout.WGMMA.reduce(1))
          plgpu.commit_smem()

          def dsts(c):
            col = ni * bn + c * epi_n
            return ((dh_gmem, col), (dh_gmem, n + col), (ap_gmem, col))

          def store(views, full_window):
            for c in range(bn // epi_n):
              for o, (dst, col) in zip(views, dsts(c)):
                if full_window:
                  plgpu.copy_smem_to_gmem(
                      o.at[c], dst.at[pl.ds(row_start, bm), pl.ds(pl.multiple_of(col, epi_n),
                                                                   epi_n)])
                else:
                  _store_rows(o.at[c], dst, row_start, lo, pl.ds(col, epi_n), rows, bm)

          _on_staging_view(untiled, swizzled, full, store)
          plgpu.copy_smem_to_gmem(ds_smem, dsp_gmem.at[ni, mi])
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)

      rows = meta_gmem[3, mi]

      @pl.when(rows > 0)
      def _():
        e = meta_gmem[0, mi]
        blk = meta_gmem[1, mi]
        lo = meta_gmem[2, mi]
        row_start = pl.multiple_of(blk * bm, bm)
        m_slice = pl.ds(row_start, bm)  # may run past P on the last block: never stored

        def acc_scope(acc_ref):
          plgpu.emit_pipeline(
              lambda _, a_smem, b_smem: plgpu.wgmma(acc_ref, a_smem, b_smem.T),
              grid=(d // bk,),
              in_specs=[
                  plgpu.BlockSpec((bm, bk), lambda k: (blk, k), delay_release=1),
                  plgpu.BlockSpec((bn, bk), lambda k: (ni, k), delay_release=1),
              ],
              max_concurrent_steps=config.max_concurrent_steps,
          )(lhs_gmem, w2_gmem.at[e])
          return acc_ref[...]

        # H gate / up tiles and the scores are TMA-loaded before the K loop, so their HBM
        # latency hides under it instead of stalling the epilogue (SMEM: 2·bm·bn H + the
        # pipeline ring, then the ring's space is reused for the output tiles).
        @functools.partial(
            pl.run_scoped,
            gate_smem=plgpu.SMEM((bm, bn), dtype, transforms=h_transforms),
            up_smem=plgpu.SMEM((bm, bn), dtype, transforms=h_transforms),
            s_smem=plgpu.SMEM((bm,), _F32),
            barriers=plgpu.Barrier(num_barriers=3),
        )
        def _(gate_smem, up_smem, s_smem, barriers):
          plgpu.copy_gmem_to_smem(h_gmem.at[m_slice, pl.ds(ni * bn, bn)], gate_smem,
                                  barriers.at[0])
          plgpu.copy_gmem_to_smem(h_gmem.at[m_slice, pl.ds(n + ni * bn, bn)], up_smem,
                                  barriers.at[1])
          plgpu.copy_gmem_to_smem(s_gmem.at[m_slice], s_smem, barriers.at[2])
          acc = pl.run_scoped(acc_scope, plgpu.ACC((bm, bn)))
          epilogue(acc, gate_smem, up_smem, s_smem, barriers, lo=lo, rows=rows, mi=mi, ni=ni,
                   row_start=row_start)

  kernel = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((p_rows, n), dtype),
                jax.ShapeDtypeStruct((grid_n, tiles_max, bm), _F32)),
      grid=(persistent_ctas(config.num_sms, interpret) * config.ctas_per_sm,),
      grid_names=("sm",),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  # One freshly built metadata buffer: Mosaic GPU custom calls need 256-byte aligned inputs,
  # which an XLA slice of a larger array need not be.
  meta = jnp.stack([tiles.expert, tiles.load // bm, tiles.dst - tiles.load, tiles.rows])
  h_ref = jax.new_ref(h)
  a_prime, ds_part = kernel(meta, lhs, w2, h_ref, scores_grouped)
  dh_out = h_ref[...]
  tile, within, valid = tiles.tile_of_row(plan.group_offsets, p_rows, plan.grouped_expert_ids())
  ds = jnp.sum(ds_part[:, tile, within], axis=0)
  return dh_out, a_prime, jnp.where(valid, ds, 0.0)


def _dh_ring(dout, w2, h, scores_grouped, plan: RoutingPlan, config: DhConfig, interpret,
             pregathered: bool = False):
  """dh on the warp-specialized cross-tile ring: ``DhConfig(gather="fused")`` gathers the dO
  rows inside the kernel; ``pregathered`` (``DhConfig(ring=True)``, gather="xla") takes ``dout``
  as the gathered (P, d) matrix and loads its tiles by TMA.

  Warpgroup 1 (producer) walks its CTA's (tile, k step) sequence and fills a
  ``max_concurrent_steps``-deep ring, the W2 tile by TMA (``full_b``) and the gathered dO rows
  dout[gather_idx[row0 : row0 + block_m], k0 : k0 + block_k] by cp.async (``full_a``,
  cp_async.py), or with ``pregathered`` the lhs tile by TMA on ``full_b`` too (two arrivals);
  warpgroup 0 (consumer) TMA-prefetches the tile's H gate/up tiles and scores,
  runs the wgmma over the ring (releasing each stage on ``empty`` one step late, after
  ``wgmma_wait(1)``), then the epilogue of the default kernel, staging one epi_n chunk of the
  three outputs at a time. Global step g of a CTA uses slot g % slots for the (g // slots)-th
  time, which gives ``full_a``'s phase parity. The ring does not restart per tile, so the next
  tile's loads overlap this tile's epilogue. Same tiles, same dS partials as the default path.
  With ``num_consumers=2`` warpgroups 0 and 1 consume (each its block_m / 2 rows of every tile:
  its own H / scores prefetch, wgmma, epilogue and ragged stores; both release each stage) and
  warpgroup 2 produces.
  """
  num_experts, n, d = w2.shape
  del num_experts
  p_rows = plan.capacity
  bm, bn, bk, epi_n = config.block_m, config.block_n, config.block_k, config.epi_n
  slots = config.max_concurrent_steps
  wgs = config.num_consumers  # per pipeline
  pipes = config.pipelines
  n_cons = pipes * wgs  # consumer warpgroups 0 .. n_cons - 1, then the producer
  n_ctas = persistent_ctas(config.num_sms, bool(interpret)) * config.ctas_per_sm
  split_n = config.consumer_split == "n" and wgs > 1
  h_from_gmem = config.h_source == "gmem"
  bm_wg = bm if split_n else bm // wgs  # rows of a tile per consumer warpgroup
  bn_cta = config.block_n_cta  # columns of n per CTA tile (each consumer's block_n with split_n)
  b_parts = wgs if split_n else 1  # W2 tile copies per step: one per consumer's columns
  dtype = h.dtype
  itemsize = jnp.dtype(dtype).itemsize
  interp = bool(interpret)
  # pipeline_ring="shared": one ring for both pipelines' consumers (the interpreter, which
  # forbids a consumer skipping barrier phases, runs the split rings instead).
  shared = pipes == 2 and config.pipeline_ring == "shared" and not interp
  ring_slots = slots if shared else pipes * slots  # ring slots allocated
  cluster_m = config.cluster_m
  multicast = multicasts(cluster_m, interp)
  tiles = tiles_lib.make_tiles(plan.group_sizes, plan.group_offsets, block_m=bm, align=bm,
                               capacity=p_rows, pair=cluster_m == 2)
  tiles_max = tiles.expert.shape[0]
  grid_n = n // bn_cta
  k_steps = d // bk
  n_chunks = bn // epi_n
  n_bufs = config.epi_buffers
  swizzled_epi = config.epilogue_swizzle
  scores_grouped = scores_grouped.astype(_F32)
  # The last block's window may run past P: its gather indices are padded with token 0 (a
  # valid row; those rows are computed and never stored). Pre-gathered, the TMA zero-fills.
  # With pair tiles an expert's extra tile is the block after its last one: one more block.
  blocks = -(-p_rows // bm) + (1 if cluster_m == 2 else 0)
  gidx = None if pregathered else jnp.pad(plan.gather_idx.astype(jnp.int32),
                                          (0, blocks * bm - p_rows))
  # Loads of H from HBM into registers have no out-of-bounds fill: the last block's rows must
  # exist, so H gets padding rows (a copy) when P is not a multiple of block_m.
  h_pad = blocks * bm - p_rows if h_from_gmem else 0
  if h_pad:
    h = jnp.pad(h, ((0, h_pad), (0, 0)))

  swizzle = plgpu.find_swizzle(epi_n * itemsize * 8)
  h_transforms = (plgpu.TilingTransform((8, swizzle // itemsize)),
                  plgpu.SwizzleTransform(swizzle))

  def body(*refs):
    refs = list(refs)
    meta_gmem = refs.pop(0)
    gidx_gmem = None if pregathered else refs.pop(0)
    dout_gmem, w2_gmem, h_gmem, s_gmem, ap_gmem, dsp_gmem, a_ring, b_ring = refs[:8]
    refs = refs[8:]
    gate_smem, up_smem = (None, None) if h_from_gmem else (refs.pop(0), refs.pop(0))
    s_smem, out_smem, ds_smem = refs[:3]
    refs = refs[3:]
    full_a = None if pregathered else refs.pop(0)
    full_b, empty, h_bars, *turn = refs
    turn = turn[0] if turn else None  # pipelines = 2: the shared ring's order barriers
    dh_gmem = h_gmem  # dH overwrites H in place (module docstring)
    wg = lax.axis_index("wg")
    num_tiles = meta_gmem[4, 0]
    if not pregathered:
      cp_async.init_barriers(full_a, ring_slots, interpret=interp)

    def pipe_items(pipe):
      """Pipeline pipe's work items, a virtual CTA's: items first, first + stride, ... of the
      snake order. Returns (first, stride, count)."""
      first = lax.axis_index("sm") * pipes + pipe
      stride = n_ctas * pipes
      return first, stride, jnp.maximum(num_tiles * grid_n - first + stride - 1, 0) // stride

    def item(first, stride, it):
      return plgpu.planar_snake(first + it * stride, (num_tiles, grid_n), 1, config.grid_block_n)

    # With 2-CTA clusters both CTAs walk the same (tile pair, N block) items, each the tile of
    # the pair given by its rank.
    rank = cluster_rank(cluster_m)

    def tiles_loop(tile_body, pipe):
      """Runs tile_body(mi, ni, g0) over this pipeline's work items (g0: its ring position);
      returns the ring steps it ran. The shared ring: over the CTA's items (both pipelines')."""
      if pipes == 1 or shared:
        pairs = num_tiles // cluster_m

        @plgpu.nd_loop((pairs * grid_n,), collective_axes="sm", init_carry=jnp.int32(0))
        def _loop(info: plgpu.NDLoopInfo, carry):
          pi, ni = plgpu.planar_snake(info.index[0], (pairs, grid_n), 1, config.grid_block_n)
          tile_body(pi * cluster_m + rank, ni, carry)
          return carry + k_steps  # global k step of this CTA: the ring position
        return _loop
      first, stride, count = pipe_items(pipe)

      @pl.loop(0, count)
      def _(it):
        tile_body(*item(first, stride, it), it * k_steps)
      return count * k_steps

    @pl.when(wg == n_cons)
    def _producer():
      plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")

      def tile(mi, ni, g0, ring0):
        e = meta_gmem[0, mi]
        row0 = meta_gmem[1, mi] * bm

        @pl.loop(0, k_steps)
        def _k(kk):
          g = g0 + kk
          slot = cp_async.ring_slot(g, slots, ring0)

          @pl.when(g >= slots)
          def _():
            plgpu.barrier_wait(empty.at[slot])
          for c in range(b_parts):
            # multicast: both CTAs of the cluster receive the whole W2 tile.
            plgpu.copy_gmem_to_smem(
                w2_gmem.at[e, pl.ds(ni * bn_cta + c * bn, bn), pl.ds(kk * bk, bk)],
                b_ring.at[slot, c], full_b.at[slot],
                collective_axes=CLUSTER_AXIS if multicast else None)
          if pregathered:
            plgpu.copy_gmem_to_smem(dout_gmem.at[pl.ds(row0, bm), pl.ds(kk * bk, bk)],
                                    a_ring.at[slot], full_b.at[slot])
          else:
            cp_async.issue_gather(gidx_gmem, dout_gmem, a_ring, full_a, slot=slot, row0=row0,
                                  k0=kk * bk, block_m=bm, block_k=bk, interpret=interp)

      if pipes == 1 or shared:
        total = tiles_loop(lambda mi, ni, g0: tile(mi, ni, g0, 0), 0)
        cp_async.drain_releases(empty, total, slots)
        return
      # One producer feeds every pipeline's ring, in the CTA's item order (item j to pipeline
      # j % pipes): it fills a ring as far as that pipeline's consumer frees it, then moves on,
      # so the pipelines' wgmmas take turns and each one's epilogue runs under the other's.
      # (A producer per pipeline needs four warpgroups, which caps a thread at 128 registers:
      # too few for a 64 x 256 accumulator, and spilling at 128 x 128; session 14.)
      items = [pipe_items(p) for p in range(pipes)]

      @pl.loop(0, items[0][2])  # pipeline 0 has the most items
      def _(it):
        for p, (first, stride, count) in enumerate(items):
          @pl.when(it < count)
          def _():
            tile(*item(first, stride, it), it * k_steps, p * slots)
      for p, (_, _, count) in enumerate(items):
        cp_async.drain_releases(empty, count * k_steps, slots, base=p * slots)

    @pl.when(wg < n_cons)
    def _consumer():
      plgpu.set_max_registers(_consumer_regs(n_cons), action="increase")
      wgmma_layout = plgpu.Layout.WGMMA
      # wg indexes the per-consumer scratch; within its pipeline the consumer is warpgroup cw.
      pipe, cw = (0, wg) if pipes == 1 else (wg // wgs, wg % wgs)
      # This pipeline's first slot (a Python 0 with one pipeline or the shared ring).
      ring0 = 0 if shared else pipe * slots
      base = 0 if split_n else cw * bm_wg  # this warpgroup's first row within a tile
      s_w, ds_w = (r.at[wg] for r in (s_smem, ds_smem))
      # Staging buffers: untiled (ragged ladder), and with epilogue_swizzle also the swizzled
      # view of the same bytes (full row windows).
      out_lin, out_swz = (None if v is None else v.at[wg]
                          for v in staging_views(out_smem, swizzled_epi))

      def stage_and_store(items, dsts, row0, off_w, rows_w):
        """items: (output i, staging buffer b, value (bm_wg, epi_n) in the WGMMA layout). Writes
        each value to its buffer, then TMA-stores the valid rows to output i's columns."""
        def write_and_store(view, full_window):
          for i, b, v in items:
            view.at[b][...] = v
          plgpu.commit_smem()
          for i, b, _ in items:
            dst, dcol = dsts[i]
            if full_window:
              plgpu.copy_smem_to_gmem(view.at[b], dst.at[pl.ds(row0, bm_wg),
                                                         pl.ds(pl.multiple_of(dcol, epi_n), epi_n)])
            else:
              _store_rows(view.at[b], dst, row0, off_w, pl.ds(dcol, epi_n), rows_w, bm_wg)

        # A full window (then off_w == 0) is this warpgroup's whole slice of the tile.
        full = None if out_swz is None else rows_w == bm_wg
        _on_staging_view(out_lin, out_swz, full, write_and_store)

      def tile(mi, ni, g0, item=None):
        """item: the CTA's item index, for the shared ring's turn barriers (else None)."""
        blk = meta_gmem[1, mi]
        lo = meta_gmem[2, mi]
        rows = meta_gmem[3, mi]
        # This warpgroup's bm_wg rows of the tile, and the valid ones among them ([lo, lo +
        # rows) of the tile, clipped; none is possible).
        row0 = pl.multiple_of(blk * bm + base, bm_wg)
        w_slice = pl.ds(row0, bm_wg)  # may run past P on the last block: never stored
        lo_w = jnp.maximum(lo, base)
        rows_w = jnp.maximum(jnp.minimum(lo + rows, base + bm_wg) - lo_w, 0)
        off_w = jnp.where(rows_w > 0, lo_w - base, 0)
        # This warpgroup's first column of n (its block_n columns of the CTA tile).
        col0 = ni * bn_cta + (cw * bn if split_n else 0)
        bars = [h_bars.at[wg * 3 + i] for i in range(3)]
        # The previous tile's epilogue has read gate/up into registers (its commit_smem fenced
        # and synchronized the warpgroup), so the TMA may overwrite them.
        if not h_from_gmem:
          plgpu.copy_gmem_to_smem(h_gmem.at[w_slice, pl.ds(col0, bn)], gate_smem.at[wg],
                                  bars[0])
          plgpu.copy_gmem_to_smem(h_gmem.at[w_slice, pl.ds(n + col0, bn)], up_smem.at[wg],
                                  bars[1])
        plgpu.copy_gmem_to_smem(s_gmem.at[w_slice], s_w, bars[2])

        def h_chunk(c):
          """H gate and up of epilogue chunk c (h.dtype, WGMMA layout), straight from HBM into
          registers (Mosaic GPU's unoptimized GMEM load: no SMEM staging)."""
          return tuple(plgpu.load(h_gmem.at[w_slice, pl.ds(off + col0 + c * epi_n, epi_n)],
                                  layout=wgmma_layout, optimized=False) for off in (0, n))

        def acc_scope(acc_ref):
          if item is not None:
            cp_async.turn_wait(turn, wg, item)

          @pl.loop(0, k_steps)
          def _k(kk):
            g = g0 + kk
            slot = cp_async.wait_stage(full_b, full_a, g=g, slots=slots, interpret=interp,
                                       base=ring0)
            a_tile = a_ring.at[slot] if bm_wg == bm else a_ring.at[slot, pl.ds(base, bm_wg)]
            b_tile = b_ring.at[slot, cw if split_n else 0]
            plgpu.wgmma(acc_ref, a_tile, b_tile.T)
            plgpu.wgmma_wait(1)  # step g - 1's wgmma is done: its stage can be refilled

            @pl.when(kk > 0)
            def _():
              plgpu.barrier_arrive(empty.at[cp_async.ring_slot(g - 1 + slots, slots, ring0)])
          if item is not None:
            cp_async.turn_arrive(turn, wg)  # every wgmma of this item is issued
          # h_lookahead: chunk 0's H loads go out while the last wgmmas run.
          first = h_chunk(0) if config.h_lookahead else None
          acc = acc_ref[...]  # waits for every wgmma of the tile
          plgpu.barrier_arrive(empty.at[cp_async.ring_slot(g0 + k_steps - 1, slots, ring0)])
          return acc, first

        ahead = h_chunk(0) if config.h_prefetch else None  # in flight during the K loop
        acc, first = pl.run_scoped(acc_scope, plgpu.ACC((bm_wg, bn)))
        ahead = first if first is not None else ahead
        for bar in bars if not h_from_gmem else bars[2:]:
          plgpu.barrier_wait(bar)
        s = plgpu.load(s_w, layout=wgmma_layout.reduce(1))
        ds = None
        for c in range(n_chunks):
          da = plgpu.layout_cast(acc[:, c * epi_n:(c + 1) * epi_n], wgmma_layout)
          if h_from_gmem:
            if ahead is not None:
              # Chunk c + 1's loads go out before chunk c's math, which hides their latency.
              this = ahead
              ahead = h_chunk(c + 1) if c + 1 < n_chunks else None
            else:
              this = h_chunk(c)
            gate, up = (v.astype(_F32) for v in this)
          else:
            cols = pl.ds(c * epi_n, epi_n)
            gate = plgpu.load(gate_smem.at[wg, :, cols], layout=wgmma_layout).astype(_F32)
            up = plgpu.load(up_smem.at[wg, :, cols], layout=wgmma_layout).astype(_F32)
          col = col0 + c * epi_n
          dsts = ((dh_gmem, col), (dh_gmem, n + col), (ap_gmem, col))
          # One staged chunk (SMEM): the previous chunk's (or tile's) stores must have read it.
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          if n_bufs == 3:
            values = [None] * 3
            ds = _epilogue_chunk(da, gate, up, s, ds, dtype, _collect(values))
            stage_and_store([(i, i, v) for i, v in enumerate(values)], dsts, row0, off_w,
                            rows_w)
          else:
            def emit(i, value):
              # Fewer staging buffers than outputs: output i reuses buffer i % n_bufs once the
              # store of the output before it there has read it.
              if i >= n_bufs:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
              stage_and_store([(i, i % n_bufs, value)], dsts, row0, off_w, rows_w)
            ds = _epilogue_chunk(da, gate, up, s, ds, dtype, emit)
        ds_w[...] = plgpu.layout_cast(ds, wgmma_layout.reduce(1))
        plgpu.commit_smem()
        # dS partials per block_n columns: with split_n each consumer writes its own row.
        n_part = ni * wgs + cw if split_n else ni
        plgpu.copy_smem_to_gmem(ds_w, dsp_gmem.at[n_part, mi, pl.ds(base, bm_wg)])

      if shared:
        # Item j is consumer j % 2's; the other skips it (d / block_k a multiple of 2 x slots
        # leaves its barrier phase bits as they were), and the turn barriers order the two
        # consumers' mainloops (cp_async.turn_*; grouped_gemm's ping-pong uses them too).
        def tile_shared(mi, ni, g0):
          item = g0 // k_steps
          pl.when(lax.rem(item, 2) == wg)(lambda: tile(mi, ni, g0, item))
        cp_async.turn_drain(turn, wg, tiles_loop(tile_shared, 0) // k_steps)
      else:
        tiles_loop(tile, pipe)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  h_scratch = [] if h_from_gmem else [
      # Per consumer warpgroup: H gate, H up.
      plgpu.SMEM((n_cons, bm_wg, bn), dtype, transforms=h_transforms),
      plgpu.SMEM((n_cons, bm_wg, bn), dtype, transforms=h_transforms),
  ]
  scratch = [
      # Untiled in the interpreter (it checks no layouts and its row copies need none); the
      # TMA-fed ring's layout is left to Mosaic GPU's inference.
      plgpu.SMEM((ring_slots, bm, bk), dtype,
                 transforms=() if interp or pregathered else cp_async.a_transforms(bk, itemsize)),
      plgpu.SMEM((ring_slots, b_parts, bn, bk), dtype),
      *h_scratch,
      # Per consumer warpgroup: scores, the epi_buffers staging buffers of one epi_n chunk of
      # dH gate, dH up and A' (untiled: the ragged stores slice any row), the dS row.
      plgpu.SMEM((n_cons, bm_wg), _F32),
      staging_smem((n_cons, n_bufs, bm_wg, epi_n), dtype, h_transforms, swizzled_epi),
      plgpu.SMEM((n_cons, bm_wg), _F32),
      *([] if pregathered else [cp_async.barrier_scratch(ring_slots, interpret=interp)]),
      # full_b: the W2 TMA(s) (and the pre-gathered dO tile's)
      plgpu.Barrier(num_arrivals=b_parts + (1 if pregathered else 0),
                    num_barriers=ring_slots),
      # empty: the release by the pipeline's consumers (of both CTAs with multicast)
      release_barrier(wgs, ring_slots, multicast),
      plgpu.Barrier(num_arrivals=1, num_barriers=3 * n_cons),  # H gate, H up, scores per consumer
      # The shared ring's turn barriers (consumer w waits on turn[w] before an item).
      *([plgpu.Barrier(num_arrivals=1, num_barriers=2)] if shared else []),
  ]
  kernel = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((p_rows, n), dtype),
                jax.ShapeDtypeStruct((n // bn, tiles_max, bm), _F32)),
      grid=(n_ctas // cluster_m,),
      grid_names=("sm",),
      **cluster_kwargs(cluster_m),
      num_threads=n_cons + 1,
      thread_name="wg",
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  # Live tiles come first (tiles.make_tiles), so the CTAs loop over num_tiles x grid_n work
  # items, the count in row 4; one freshly stacked buffer (256-byte aligned, see dh()).
  meta = jnp.stack([tiles.expert, tiles.load // bm, tiles.dst - tiles.load, tiles.rows,
                    jnp.broadcast_to(tiles.num_tiles, (tiles_max,)).astype(jnp.int32)])
  h_ref = jax.new_ref(h)
  operands = (dout,) if pregathered else (gidx, dout)
  a_prime, ds_part = kernel(meta, *operands, w2, h_ref, scores_grouped)
  dh_out = h_ref[...]
  if h_pad:
    dh_out = dh_out[:p_rows]
  tile, within, valid = tiles.tile_of_row(plan.group_offsets, p_rows, plan.grouped_expert_ids())
  ds = jnp.sum(ds_part[:, tile, within], axis=0)
  return dh_out, a_prime, jnp.where(valid, ds, 0.0)


__all__ = ["DhConfig", "dh", "dh_config_for", "validate_dh_args", "validate_dh_shapes"]
