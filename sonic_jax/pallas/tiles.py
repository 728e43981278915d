"""Per-M-tile metadata for the varlen-M grouped GEMMs (grouped_gemm.py, dh.py), computed in JAX.

Tile i multiplies the ``block_m`` rows [load[i], load[i] + block_m) of the grouped operand by
expert[i]'s weights and owns (stores) rows [dst[i], dst[i] + rows[i]) of that expert's group
(load[i] <= dst[i], dst[i] + rows[i] <= load[i] + block_m); rows of the window outside
[dst, dst + rows) are computed and dropped. An expert's windows start at
floor_align(group start) + j·block_m, so every load row is a multiple of ``align``: Mosaic GPU
lowers the TMA of a tile into tiled/swizzled SMEM (the wgmma operand layout) only when it can
prove that divisibility ("Failed to infer a possible set of layouts. You need to prove the
divisibility of index 0 using pl.multiple_of"), which is why tiles that start exactly at group
starts, the first design, are not used. ``align = 8`` (the forward GEMMs) adds at most one tile
per expert; ``align = block_m`` (dh) gives block-aligned tiles, one per (block, expert)
intersection. No tile mixes two experts and no kernel loops over experts; tiles past
``num_tiles`` have rows == 0 and expert == load == dst == 0. ``pair=True`` (2-CTA clusters)
gives every expert an even tile count; the extra tile owns no rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def max_tiles(capacity: int, num_experts: int, block_m: int, align: int,
              pair: bool = False) -> int:
  """Static bound on the tile count for any group sizes with Σ_e f_e <= capacity (``pair``:
  each expert's count rounded up to even, at most one more tile per expert)."""
  nonempty = min(num_experts, capacity)  # experts that can own rows
  extra = nonempty if pair else 0
  if align == block_m:
    # Each of the cdiv(capacity, block_m) blocks is split at most once per group boundary.
    return -(-capacity // block_m) + nonempty + extra
  # Σ_e ceil((f_e + r_e) / block_m) over non-empty experts, r_e = start_e mod align < align.
  return -(-(capacity + (align - 1) * nonempty) // block_m) + nonempty + extra


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tiles:
  """(num_tiles_max,) int32 arrays per tile, (E,) tile_begin, and the traced tile count."""

  expert: jax.Array
  load: jax.Array  # first row of the window, a multiple of align
  dst: jax.Array  # first owned row
  rows: jax.Array  # owned rows (0 past num_tiles)
  num_tiles: jax.Array  # () int32
  tile_begin: jax.Array  # (E,) first tile of each expert
  aligned_start: jax.Array  # (E,) floor_align(group start)
  block_m: int = dataclasses.field(metadata=dict(static=True))
  align: int = dataclasses.field(metadata=dict(static=True))

  def tile_of_row(self, group_offsets: jax.Array, capacity: int,
                  row_expert: jax.Array | None = None):
    """(capacity,) grouped row p -> (tile owning p, p's row inside that tile's window, valid).

    row_expert: optional (capacity,) expert of each grouped row (any in-range value on
    padding), e.g. ``plan.grouped_expert_ids()``: one gather instead of a binary search
    over group_offsets (log2 E + 1 dependent XLA kernels on a GPU).
    Rows past group_offsets[E] (padding) get valid = False and an in-range (tile, row).
    """
    num_experts = self.tile_begin.shape[0]
    p = jnp.arange(capacity, dtype=jnp.int32)
    if row_expert is None:
      row_expert = jnp.searchsorted(group_offsets[1:], p, side="right")
    e = jnp.clip(row_expert, 0, num_experts - 1)
    tile = self.tile_begin[e] + (p - self.aligned_start[e]) // self.block_m
    tile = jnp.clip(tile, 0, self.expert.shape[0] - 1)
    within = jnp.clip(p - self.load[tile], 0, self.block_m - 1)
    return tile, within, p < group_offsets[-1]


_COMPARE_ALL_MAX = 1 << 22  # E x tiles compares in one fusion: a few microseconds


def make_tiles(group_sizes: jax.Array, group_offsets: jax.Array, *, block_m: int, align: int,
               capacity: int, m_rows: int | None = None, pair: bool = False) -> Tiles:
  """group_sizes (E,), group_offsets (E+1,) int32 -> Tiles (O(E + tiles) JAX ops, no loops).

  align: a multiple of 8 dividing block_m. capacity: static bound on Σ group_sizes.
  m_rows: when given (a multiple of align, >= block_m), windows are clamped to end inside an
  array of m_rows rows (load <= m_rows - block_m); when None, the last window of the last group
  may run past the rows (the caller must tolerate, or never store, such rows).
  pair: every expert gets an even number of tiles, so tiles 2i and 2i + 1 always belong to one
  expert (the two CTAs of a 2-CTA cluster share its weight tile); an expert with an odd count
  gets one more window past its rows, which owns none (rows == 0).
  """
  if align % 8 or block_m % align:
    raise ValueError(f"align ({align}) must be a multiple of 8 dividing block_m ({block_m})")
  if m_rows is not None and (m_rows % align or m_rows < block_m):
    raise ValueError(f"m_rows ({m_rows}) must be a multiple of align ({align}) and >= block_m "
                     f"({block_m})")
  num_experts = group_sizes.shape[0]
  n_max = max_tiles(capacity, num_experts, block_m, align, pair)
  begin = group_offsets[:-1]
  end = begin + group_sizes
  aligned = (begin // align) * align
  per_expert = jnp.where(group_sizes > 0, (end - aligned + block_m - 1) // block_m, 0)
  if pair:
    per_expert = per_expert + per_expert % 2
  tile_end = jnp.cumsum(per_expert, dtype=jnp.int32)  # inclusive
  tile_begin = tile_end - per_expert
  i = jnp.arange(n_max, dtype=jnp.int32)
  # One fused compare-and-count where it is small (XLA's default binary search is log2 E + 1
  # dependent kernels of ~1-2 us each on a GPU, per call).
  method = "compare_all" if num_experts * n_max <= _COMPARE_ALL_MAX else "scan"
  e = jnp.minimum(jnp.searchsorted(tile_end, i, side="right", method=method),
                  num_experts - 1).astype(jnp.int32)
  num_tiles = tile_end[-1]
  live = i < num_tiles
  win = aligned[e] + (i - tile_begin[e]) * block_m
  dst = jnp.maximum(begin[e], win)
  rows = jnp.maximum(jnp.minimum(end[e], win + block_m) - dst, 0)  # 0: a pair's extra tile
  load = win if m_rows is None else jnp.minimum(win, m_rows - block_m)
  z = lambda a: jnp.where(live, a, 0).astype(jnp.int32)
  return Tiles(expert=z(e), load=z(load), dst=z(dst), rows=z(rows), num_tiles=num_tiles,
               tile_begin=tile_begin.astype(jnp.int32), aligned_start=aligned.astype(jnp.int32),
               block_m=block_m, align=align)


__all__ = ["Tiles", "make_tiles", "max_tiles"]
