"""Per-M-tile metadata for varlen-M grouped GEMMs, computed once per step in JAX.

Tile i covers grouped rows [row_start[i], row_start[i] + rows[i]) of expert expert[i]; tiles
start at each group's first row (not at multiples of block_m), so no tile mixes two experts and
no kernel loops over all experts to find its group. Tiles past ``num_tiles`` have rows == 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def max_tiles(capacity: int, num_experts: int, block_m: int) -> int:
  """Static bound on Σ_e ceil(f_e / block_m) for Σ_e f_e <= capacity."""
  return -(-capacity // block_m) + min(num_experts, capacity)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TileMetadata:
  """(num_tiles_max,) int32 arrays plus the traced tile count."""

  expert: jax.Array
  row_start: jax.Array
  rows: jax.Array
  num_tiles: jax.Array
  block_m: int = dataclasses.field(metadata=dict(static=True))


def make_tile_metadata(group_sizes: jax.Array, group_offsets: jax.Array, *, block_m: int,
                       capacity: int) -> TileMetadata:
  """group_sizes (E,), group_offsets (E+1,) -> TileMetadata for tiles of block_m rows."""
  num_experts = group_sizes.shape[0]
  n_max = max_tiles(capacity, num_experts, block_m)
  tiles_per_expert = (group_sizes + block_m - 1) // block_m
  tile_end = jnp.cumsum(tiles_per_expert, dtype=jnp.int32)  # inclusive
  tile_begin = tile_end - tiles_per_expert
  i = jnp.arange(n_max, dtype=jnp.int32)
  expert = jnp.minimum(jnp.searchsorted(tile_end, i, side="right"), num_experts - 1)
  expert = expert.astype(jnp.int32)
  local = i - tile_begin[expert]
  num_tiles = tile_end[-1]
  live = i < num_tiles
  row_start = jnp.where(live, group_offsets[expert] + local * block_m, 0).astype(jnp.int32)
  rows = jnp.where(live, jnp.minimum(block_m, group_sizes[expert] - local * block_m), 0)
  return TileMetadata(expert=jnp.where(live, expert, 0), row_start=row_start,
                      rows=rows.astype(jnp.int32), num_tiles=num_tiles, block_m=block_m)
