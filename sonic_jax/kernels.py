"""The kernel contract: eight entry points every backend implements with the same meaning.

Shapes (P = plan capacity, rows in grouped order; n = expert intermediate size):
  x (T, d), w1 (E, d, 2n) with w1[..., :n] = gate and w1[..., n:] = up ("concat" layout),
  w2 (E, n, d), H (P, 2n), A (P, n), Y (P, d), dO (T, d).
Operands are bf16 (or f32), accumulation is fp32, scores and dS are fp32. Rows of P outside
the expert groups (token-rounding padding) are never read by a consumer; producers may leave
anything there. Backends may fuse several entry points as long as results match.
"""

from __future__ import annotations

import abc
from collections.abc import Collection

import jax

from sonic_jax.routing import RoutingPlan


class ExpertKernels(abc.ABC):
  """A backend: the eight kernel entry points of the expert block."""

  name: str = "abstract"
  # Order the backward for peak memory with optimization barriers: dx_pairs after dW2 and dW1
  # (with its gather of x rows, where the backend gathers outside the kernel) after dW2 and dx.
  # XLA otherwise may run dx_pairs or gather x early, so that the (P, d) gathered x, the
  # gathered dO and dX_pairs are live at once. Costs nothing on one stream; a backend whose
  # forward gathers x with XLA loses the CSE of that gather with dW1's.
  dw1_last: bool = False

  def validate(self, x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array) -> None:
    """Raises ValueError (naming the argument and the rule) for shapes this backend cannot tile.

    Called with concrete shapes before any kernel runs; the default accepts everything.
    """

  def validate_entries(self, x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array,
                       entries: Collection[str]) -> None:
    """``validate`` for a caller that runs only ``entries`` (names of ``mixed.ENTRY_POINTS``) on
    this backend, as ``MixedKernels`` does; the default checks everything (``validate``)."""
    del entries
    self.validate(x, plan, w1, w2)

  @abc.abstractmethod
  def up_proj(self, x: jax.Array, w1: jax.Array, plan: RoutingPlan, *,
              inference: bool = False) -> tuple[jax.Array | None, jax.Array]:
    """Gathered x · W1 with SwiGLU epilogue.

    H[p] = x[gather_idx[p]] · w1[e(p)] (fp32 accumulate, stored in x.dtype),
    A[p] = silu(H_gate) · H_up computed from the fp32 accumulator.
    Returns (H (P, 2n) or None when ``inference``, A (P, n)).
    """

  @abc.abstractmethod
  def down_proj(self, a: jax.Array, w2: jax.Array, plan: RoutingPlan) -> jax.Array:
    """Y[p] = A[p] · w2[e(p)]: (P, n) -> (P, d) in a.dtype."""

  @abc.abstractmethod
  def combine(self, y: jax.Array, plan: RoutingPlan, scores: jax.Array | None,
              out_dtype) -> jax.Array:
    """out[t] = Σ_{j in token t} s_j · Y[reverse_idx[j]] (fp32 accumulate), (P, d) -> (T, d).

    scores: (P,) fp32 in flat order, or None for an unweighted sum (the dx combine).
    Tokens with no pairs get zeros.
    """

  def combine_add(self, y: jax.Array, plan: RoutingPlan, addend: jax.Array,
                  out_dtype) -> jax.Array:
    """out[t] = Σ_{j in token t} Y[reverse_idx[j]] + addend[t]: the dx combine with the
    router's x-gradient addend (T, d) added. This default adds after ``combine``; a backend
    whose combine can take the addend in its fp32 sum (one pass over dx fewer) overrides it.
    """
    return (self.combine(y, plan, None, out_dtype) + addend.astype(out_dtype)).astype(out_dtype)

  @abc.abstractmethod
  def dh(self, dout: jax.Array, w2: jax.Array, h: jax.Array, scores_grouped: jax.Array,
         plan: RoutingPlan) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Down-projection backward with the dSwiGLU / dS / A' epilogue.

    dA'[p] = dout[gather_idx[p]] · w2[e(p)]ᵀ (fp32); A recomputed from H;
    dS[p] = ⟨dA'[p], A[p]⟩ (fp32); dH[p] = s_p · dSwiGLU(dA'[p]) (concat layout, h.dtype);
    A'[p] = s_p · A[p] (h.dtype). scores_grouped: (P,) fp32.
    Returns (dH (P, 2n), A' (P, n), dS (P,) fp32), all in grouped order.
    """

  @abc.abstractmethod
  def dw2(self, dout: jax.Array, a_prime: jax.Array, plan: RoutingPlan) -> jax.Array:
    """dW2[e] = Σ_{p in e} A'[p]ᵀ ⊗ dout[gather_idx[p]] -> (E, n, d), fp32 or a_prime.dtype.

    Empty experts give zeros.
    """

  @abc.abstractmethod
  def dx_pairs(self, dh: jax.Array, w1: jax.Array, plan: RoutingPlan) -> jax.Array:
    """dX_pairs[p] = dH[p] · w1[e(p)]ᵀ: (P, 2n) -> (P, d) in dh.dtype."""

  @abc.abstractmethod
  def dw1(self, x: jax.Array, dh: jax.Array, plan: RoutingPlan) -> jax.Array:
    """dW1[e] = Σ_{p in e} x[gather_idx[p]]ᵀ ⊗ dH[p] -> (E, d, 2n), fp32 or dh.dtype.

    Empty experts give zeros.
    """

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.name!r}>"
