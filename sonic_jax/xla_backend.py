"""The ``xla`` backend: the eight kernel entry points in plain JAX.

It is the reference the kernel backends are tested against and the path CPU users run. Grouped
GEMMs use ``jax.lax.ragged_dot`` / ``ragged_dot_general`` with fp32 accumulation; gathers are
XLA gathers. Simple and obviously correct, not fast on GPUs (XLA densifies ragged dots).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sonic_jax.kernels import ExpertKernels
from sonic_jax.routing import RoutingPlan

_F32 = jnp.float32


def swiglu(h: jax.Array) -> jax.Array:
  """(…, 2n) concat-layout pre-activation -> (…, n) silu(gate) · up, in h's dtype."""
  n = h.shape[-1] // 2
  return jax.nn.silu(h[..., :n]) * h[..., n:]


def dswiglu(da: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Gradient of swiglu at h (…, 2n, fp32) for upstream da (…, n): returns (dH (…, 2n), A)."""
  n = h.shape[-1] // 2
  gate, up = h[..., :n], h[..., n:]
  sig = jax.nn.sigmoid(gate)
  silu = gate * sig
  dgate = da * up * sig * (1.0 + gate * (1.0 - sig))
  dup = da * silu
  return jnp.concatenate([dgate, dup], axis=-1), silu * up


def _grouped_matmul(lhs: jax.Array, rhs: jax.Array, plan: RoutingPlan) -> jax.Array:
  """lhs (P, k) rows of expert e times rhs[e] (E, k, m) -> (P, m) fp32; padding rows -> 0."""
  return jax.lax.ragged_dot(lhs, rhs, plan.group_sizes, preferred_element_type=_F32)


def _grouped_outer(lhs: jax.Array, rhs: jax.Array, plan: RoutingPlan) -> jax.Array:
  """Σ_{p in e} lhs[p]ᵀ ⊗ rhs[p] for lhs (P, a), rhs (P, b) -> (E, a, b) fp32."""
  dims = jax.lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(((0,), (0,)), ((), ())),
      lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
  return jax.lax.ragged_dot_general(lhs, rhs, plan.group_sizes, dims,
                                    preferred_element_type=_F32)


def combine_sum_f32(y, plan, scores):
  """Σ_{j in token t} s_j · Y[reverse_idx[j]] (T, d) in fp32 (unweighted when scores is None)."""
  rows = y[plan.reverse_idx].astype(_F32)  # flat order
  if scores is not None:
    rows = rows * scores[:, None]
  if plan.top_k is not None:
    return rows.reshape(plan.num_tokens, plan.top_k, -1).sum(axis=1)
  rows = jnp.where(_row_mask(plan), rows, 0.0)
  return jax.ops.segment_sum(rows, plan.token_ids, num_segments=plan.num_tokens,
                             indices_are_sorted=True)


def _row_mask(plan: RoutingPlan) -> jax.Array:
  return plan.valid_mask()[:, None]


class XlaKernels(ExpertKernels):
  """Pure-JAX implementation of the kernel contract (see ``sonic_jax.kernels``)."""

  name = "xla"
  dw1_last = True  # its forward gathers x too: without the barrier that copy lives to dW1

  # Stateless: every XlaKernels is the same backend (one cached custom_vjp trace, and equal
  # entries in a MixedKernels). Subclasses may hold state (tests record calls), so they compare
  # by identity unless they say otherwise.
  def __eq__(self, other):
    if type(self) is not XlaKernels:
      return self is other
    return type(other) is XlaKernels

  def __hash__(self):
    return hash(XlaKernels) if type(self) is XlaKernels else id(self)

  def up_proj(self, x, w1, plan, *, inference=False):
    acc = _grouped_matmul(x[plan.gather_idx], w1, plan)
    a = swiglu(acc).astype(x.dtype)
    return (None if inference else acc.astype(x.dtype)), a

  def down_proj(self, a, w2, plan):
    return _grouped_matmul(a, w2, plan).astype(a.dtype)

  def combine(self, y, plan, scores, out_dtype):
    return combine_sum_f32(y, plan, scores).astype(out_dtype)

  def combine_add(self, y, plan, addend, out_dtype):
    # In the sum's fusion: one pass over dx instead of an add kernel's three.
    return (combine_sum_f32(y, plan, None) + addend.astype(_F32)).astype(out_dtype)

  def dh(self, dout, w2, h, scores_grouped, plan):
    da = _grouped_matmul(dout[plan.gather_idx], jnp.swapaxes(w2, 1, 2), plan)
    dh_unscaled, a = dswiglu(da, h.astype(_F32))
    ds = jnp.sum(da * a, axis=-1)
    s = scores_grouped[:, None]
    return (s * dh_unscaled).astype(h.dtype), (s * a).astype(h.dtype), ds

  def dw2(self, dout, a_prime, plan):
    return _grouped_outer(a_prime, dout[plan.gather_idx], plan)

  def dx_pairs(self, dh, w1, plan):
    return _grouped_matmul(dh, jnp.swapaxes(w1, 1, 2), plan).astype(dh.dtype)

  def dw1(self, x, dh, plan):
    return _grouped_outer(x[plan.gather_idx], dh, plan)
