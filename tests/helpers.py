"""Shared test utilities: random MoE problems and relative errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def rel_err(a, b) -> float:
  """||a - b|| / ||b|| in float64; NaN/inf in either side returns inf (never passes)."""
  a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    return float("inf")
  denom = np.linalg.norm(b)
  assert denom > 0, "reference is all zeros: the comparison would be meaningless"
  return float(np.linalg.norm(a - b) / denom)


@dataclasses.dataclass(frozen=True)
class Problem:
  T: int
  d: int
  n: int
  E: int
  K: int
  skew: str = "none"  # none | empty (some experts never chosen) | one (all tokens prefer expert 0)
  seed: int = 0


def make_inputs(p: Problem, dtype=jnp.float32):
  """x (T,d), router_w (d,E), w1 (E,d,2n), w2 (E,n,d) with activations of realistic scale."""
  k = jax.random.split(jax.random.key(p.seed), 4)
  x = jax.random.normal(k[0], (p.T, p.d), jnp.float32)
  rw = jax.random.normal(k[1], (p.d, p.E), jnp.float32) / np.sqrt(p.d)
  if p.skew == "empty":  # experts 1 and E-1 are never picked
    rw = rw.at[:, 1].set(-rw[:, 1] * 0 - 0.0).at[:, p.E - 1].set(0.0)
    x = x.at[:, 0].set(jnp.abs(x[:, 0]) + 1.0)
    rw = rw.at[0, 1].set(-50.0).at[0, p.E - 1].set(-50.0)
  elif p.skew == "one":  # expert 0 is everybody's first choice
    x = x.at[:, 0].set(jnp.abs(x[:, 0]) + 1.0)
    rw = rw.at[0, 0].set(50.0)
  w1 = jax.random.normal(k[2], (p.E, p.d, 2 * p.n), jnp.float32) / np.sqrt(p.d)
  w2 = jax.random.normal(k[3], (p.E, p.n, p.d), jnp.float32) / np.sqrt(p.n)
  return tuple(a.astype(dtype) for a in (x, rw, w1, w2))


def value_and_grads(fn, args, ct):
  """Output of fn(*args) and the gradients of <fn(*args), ct> for every argument, one jit."""

  @jax.jit
  def run(args):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(ct)

  return run(args)


def gpu_triton_impls() -> list[str]:
  """The sonic_jax.triton implementations that run here (GPU tests skip the others)."""
  from sonic_jax import triton as tri
  impls = ["pallas_triton"]
  if tri.jax_triton_unavailable_reason() is None:
    impls.append("jax_triton")
  return impls
