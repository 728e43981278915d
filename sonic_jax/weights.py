"""Weight layout helpers: w1 (E, d, 2n) holds [gate | up] along its last axis ("concat" layout).

Kernels load the gate and up halves of each N tile with two copies, so the SwiGLU epilogue stays
local to one tile and Hugging Face style separate gate/up weights convert with a concatenate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fuse_gate_up(w_gate: jax.Array, w_up: jax.Array) -> jax.Array:
  """w_gate, w_up (E, d, n) -> w1 (E, d, 2n)."""
  if getattr(w_gate, "ndim", None) != 3 or jnp.shape(w_gate) != jnp.shape(w_up):
    raise ValueError(
        f"w_gate and w_up must both have shape (E, d, n), got {jnp.shape(w_gate)} and "
        f"{jnp.shape(w_up)}")
  if w_gate.dtype != w_up.dtype:
    raise ValueError(f"w_gate and w_up must share a dtype, got {w_gate.dtype} and {w_up.dtype}")
  return jnp.concatenate([w_gate, w_up], axis=-1)


def split_gate_up(w1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """w1 (E, d, 2n) -> (w_gate, w_up), each (E, d, n). Inverse of ``fuse_gate_up``."""
  if getattr(w1, "ndim", None) != 3 or w1.shape[-1] % 2:
    raise ValueError(f"w1 must have shape (E, d, 2n), got {jnp.shape(w1)}")
  n = w1.shape[-1] // 2
  return w1[..., :n], w1[..., n:]
