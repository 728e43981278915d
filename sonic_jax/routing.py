"""Routing: router scores, top-K, token rounding, and the RoutingPlan every backend consumes.

Pairs (token, expert) live in two orders:

* flat order ``j``: sorted by token (for top-K, ``j = t*K + k``); valid pairs first, then padding.
* grouped order ``p``: sorted by expert, stable in ``j``; expert ``e`` owns rows
  ``[group_offsets[e], group_offsets[e+1])``; rows from ``group_offsets[E]`` on are padding.

Every array has a static shape. Top-K routing has exactly ``T*K`` pairs; token rounding has a
data-dependent pair count, so its plan is a fixed-capacity buffer whose group sizes say which rows
are real. Kernels read and write only rows inside groups.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

RoundingMode = Literal["nearest", "up", "down"]


@dataclasses.dataclass(frozen=True)
class TokenRounding:
  """Tile-aware token rounding (SonicMoE §6): per-expert counts become multiples of ``tile``.

  mode: ``nearest`` (round half to even, changes an expert by at most ``tile/2``), ``up``
  (adds the best unchosen tokens by softmax probability) or ``down`` (drops the lowest-ranked
  token choices). Counts are capped at the number of tokens.
  """

  tile: int = 128
  mode: RoundingMode = "nearest"

  def __post_init__(self):
    if not isinstance(self.tile, int) or self.tile < 1:
      raise ValueError(f"TokenRounding.tile must be a positive int, got {self.tile!r}")
    if self.mode not in ("nearest", "up", "down"):
      raise ValueError(
          f"TokenRounding.mode must be one of 'nearest', 'up', 'down', got {self.mode!r}")

  def capacity(self, num_tokens: int, num_experts: int, top_k: int) -> int:
    """Static upper bound on the number of kept pairs."""
    extra = {"nearest": self.tile // 2, "up": self.tile - 1, "down": 0}[self.mode]
    return min(num_tokens * top_k + num_experts * extra, num_tokens * num_experts)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoutingPlan:
  """Routing of T tokens to E experts with static shapes (P = capacity).

  Array fields (int32 unless noted):
    scores: (P,) float32, gate weight of flat pair j (0 on padding). Differentiable.
    token_ids: (P,) token of flat pair j (0 on padding).
    expert_ids: (P,) expert of flat pair j (0 on padding).
    token_offsets: (T+1,) CSR offsets of each token's pairs in flat order.
    group_sizes: (E,) rows per expert.
    group_offsets: (E+1,) exclusive prefix sum of group_sizes.
    gather_idx: (P,) grouped row p -> token (0 on padding).
    scatter_idx: (P,) grouped row p -> flat pair j.
    reverse_idx: (P,) flat pair j -> grouped row p (inverse permutation of scatter_idx).
  Static fields:
    num_tokens (T), num_experts (E), top_k: K when every token has exactly K pairs and
    ``j = t*K + k`` (top-K routing), else None (variable pairs per token, e.g. token rounding).
  """

  scores: jax.Array
  token_ids: jax.Array
  expert_ids: jax.Array
  token_offsets: jax.Array
  group_sizes: jax.Array
  group_offsets: jax.Array
  gather_idx: jax.Array
  scatter_idx: jax.Array
  reverse_idx: jax.Array
  num_tokens: int = dataclasses.field(metadata=dict(static=True))
  num_experts: int = dataclasses.field(metadata=dict(static=True))
  top_k: int | None = dataclasses.field(metadata=dict(static=True))

  @property
  def capacity(self) -> int:
    return self.gather_idx.shape[0]

  @property
  def num_pairs(self) -> jax.Array:
    """Number of valid pairs (a traced scalar)."""
    return self.group_offsets[-1]

  @property
  def fixed_top_k(self) -> int | None:
    """K when every token has exactly K pairs at flat positions t·K + k and P = T·K (what a
    per-token scatter of rows needs), else None."""
    if self.top_k is None or self.capacity != self.num_tokens * self.top_k:
      return None
    return self.top_k

  def valid_mask(self) -> jax.Array:
    """(P,) bool: flat pair j (equivalently grouped row p) is a real pair."""
    return jnp.arange(self.capacity, dtype=jnp.int32) < self.num_pairs

  def grouped_scores(self) -> jax.Array:
    """(P,) float32 scores in grouped (expert-sorted) order."""
    return self.scores[self.scatter_idx]

  def grouped_expert_ids(self) -> jax.Array:
    """(P,) int32 expert of each grouped row (0 on padding rows)."""
    return self.expert_ids[self.scatter_idx]

  def replace(self, **kw) -> "RoutingPlan":
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_assignments(cls, token_ids: jax.Array, expert_ids: jax.Array, scores: jax.Array,
                       *, num_tokens: int, num_experts: int, valid: jax.Array | None = None,
                       top_k: int | None = None) -> "RoutingPlan":
    """Builds a plan from (token, expert, score) triples in flat order.

    token_ids, expert_ids, scores: (P,). Valid pairs must come first, sorted by token
    (ascending); ``valid`` (P,) bool marks them (all valid when None). With ``top_k`` set,
    pairs must be exactly ``j = t*K + k``.
    """
    capacity = token_ids.shape[0]
    token_ids = token_ids.astype(jnp.int32)
    expert_ids = expert_ids.astype(jnp.int32)
    scores = scores.astype(jnp.float32)
    if valid is None:
      valid = jnp.ones((capacity,), bool)
    token_ids = jnp.where(valid, token_ids, 0)
    expert_ids = jnp.where(valid, expert_ids, 0)
    scores = jnp.where(valid, scores, 0.0)
    # Stable sort by expert with padding (key E) last: grouped order p -> flat pair j.
    key = jnp.where(valid, expert_ids, num_experts)
    scatter_idx = jnp.argsort(key, stable=True).astype(jnp.int32)
    reverse_idx = jnp.zeros((capacity,), jnp.int32).at[scatter_idx].set(
        jnp.arange(capacity, dtype=jnp.int32))
    gather_idx = token_ids[scatter_idx]
    group_sizes = jnp.zeros((num_experts,), jnp.int32).at[expert_ids].add(
        valid.astype(jnp.int32))
    group_offsets = jnp.concatenate(
        [jnp.zeros((1,), jnp.int32), jnp.cumsum(group_sizes, dtype=jnp.int32)])
    if top_k is not None:
      token_offsets = jnp.arange(num_tokens + 1, dtype=jnp.int32) * top_k
    else:
      sort_key = jnp.where(valid, token_ids, num_tokens)
      token_offsets = jnp.searchsorted(
          sort_key, jnp.arange(num_tokens + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return cls(scores=scores, token_ids=token_ids, expert_ids=expert_ids,
               token_offsets=token_offsets, group_sizes=group_sizes,
               group_offsets=group_offsets, gather_idx=gather_idx, scatter_idx=scatter_idx,
               reverse_idx=reverse_idx, num_tokens=num_tokens, num_experts=num_experts,
               top_k=top_k)


def _is_float(a) -> bool:
  return jnp.issubdtype(jnp.result_type(a), jnp.floating)


def router_logits(x: jax.Array, router_w: jax.Array) -> jax.Array:
  """x (T, d) · router_w (d, E) -> (T, E) float32 logits (operands in their dtype, fp32 acc)."""
  return jnp.dot(x, router_w, preferred_element_type=jnp.float32)


def validate_routing_args(logits: jax.Array, top_k: int, routing) -> TokenRounding | None:
  """Checks router logits (T, E), top_k and routing; returns the token-rounding config or None."""
  if getattr(logits, "ndim", None) != 2:
    raise ValueError(f"logits must have shape (T, E), got shape {jnp.shape(logits)}")
  if not _is_float(logits):
    raise ValueError(f"logits must be floating point, got dtype {jnp.result_type(logits)}")
  num_experts = logits.shape[1]
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
    raise ValueError(f"top_k must be an int, got {top_k!r}")
  if not 1 <= top_k <= num_experts:
    raise ValueError(
        f"top_k must satisfy 1 <= top_k <= num_experts ({num_experts}), got {top_k}")
  if isinstance(routing, TokenRounding):
    return routing
  if routing == "topk":
    return None
  if routing == "token_rounding":
    return TokenRounding()
  raise ValueError(
      f"routing must be 'topk', 'token_rounding' or a sonic_jax.TokenRounding, got {routing!r}")


def route_logits(logits: jax.Array, *, top_k: int, renormalize: bool = True,
                 routing: str | TokenRounding = "topk", impl: str = "xla",
                 interpret: bool = False) -> RoutingPlan:
  """Routes tokens from router logits (T, E).

  Scores are fp32: p = softmax(logits) over all experts; top-K by p; with ``renormalize`` the
  K scores are divided by their sum (equal to SonicMoE's softmax over the top-K logits), else
  they are the raw probabilities. Token rounding keeps, per expert, the best-ranked tokens up to a
  multiple of the tile (see ``TokenRounding``); kept pairs take p (divided by the sum of the
  token's top-K probabilities when ``renormalize``), so a tile of 1 reproduces top-K routing.

  impl: "xla" (this module), or a kernel implementation from sonic_jax.triton ("jax_triton",
  "pallas_triton", or "auto": the fastest measured one that runs here, else "xla"). Top-K
  routing then runs entirely in its kernels; token rounding runs here except its per-expert
  selection, which takes that implementation's radix-select kernel
  (``sonic_jax.triton.select_top_per_column``, 2.0-2.2x the bisection on an H200 at T=32768,
  E=128/256). Every implementation gives the same plan, bit for bit. ``interpret`` runs the
  Pallas-Triton kernels in interpret mode (CPU tests).
  """
  rounding = validate_routing_args(logits, top_k, routing)
  # Top-K routing by the sonic_jax.triton kernels: the same plan, bit for bit.
  if impl != "xla":
    from sonic_jax import triton as triton_routing
    impl = triton_routing.resolve_route_impl(impl)
    if impl != "xla" and rounding is None:
      return triton_routing.route_logits(logits, top_k=top_k, renormalize=renormalize,
                                         impl=impl, interpret=interpret)
  num_experts = logits.shape[1]
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  top_p, top_e = jax.lax.top_k(probs, top_k)
  if rounding is None:
    return plan_from_top_k(top_p, top_e, num_experts, renormalize, "xla", interpret)
  denom = jnp.sum(top_p, axis=-1, keepdims=True) if renormalize else None
  return _token_rounding_plan(probs, top_p, top_e, denom, rounding, top_k,
                              select_impl=impl, interpret=interpret)


def _token_rounding_plan(probs, top_p, top_e, denom, rounding: TokenRounding, top_k: int, *,
                         select_impl: str = "xla", interpret: bool = False) -> RoutingPlan:
  num_tokens, num_experts = probs.shape
  tokens = jnp.arange(num_tokens, dtype=jnp.int32)
  chosen = jnp.zeros((num_tokens, num_experts), bool).at[tokens[:, None], top_e].set(True)
  counts = jnp.sum(chosen, axis=0, dtype=jnp.int32)
  # Ranking: token-choice pairs (renormalized score in (0, 1]) outrank every unchosen pair
  # (p - 1 in (-1, 0]); within each set, by score.
  v = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
  rank_val = (probs - 1.0).at[tokens[:, None], top_e].set(v)
  tile = rounding.tile
  if rounding.mode == "nearest":
    rounded = jnp.round(counts / tile).astype(jnp.int32) * tile  # half to even
  elif rounding.mode == "up":
    rounded = -(-counts // tile) * tile
  else:
    rounded = (counts // tile) * tile
  rounded = jnp.minimum(rounded, num_tokens)
  if select_impl == "xla":
    keep = select_top_per_column(rank_val, rounded)
  else:
    from sonic_jax import triton as triton_routing
    # The mask only picks indices (gradients reach the scores through probs below), and the
    # kernel has no differentiation rule: its input is cut from the autodiff graph.
    keep = triton_routing.select_top_per_column(jax.lax.stop_gradient(rank_val), rounded,
                                                impl=select_impl, interpret=interpret)
  capacity = rounding.capacity(num_tokens, num_experts, top_k)
  t_idx, e_idx = jnp.nonzero(keep, size=capacity, fill_value=0)  # row-major: sorted by token
  valid = jnp.arange(capacity) < jnp.sum(keep)
  scores = probs[t_idx, e_idx]
  if denom is not None:
    scores = scores / denom[t_idx, 0]
  return RoutingPlan.from_assignments(t_idx, e_idx, scores, num_tokens=num_tokens,
                                      num_experts=num_experts, valid=valid)


def _ordered_key(v: jax.Array) -> jax.Array:
  """int32 keys with the order of the float32 values (-0.0 counted as +0.0; no NaNs)."""
  v = v.astype(jnp.float32)
  # where, not v + 0.0: XLA simplifies the addition away and -0.0 would survive.
  bits = jax.lax.bitcast_convert_type(jnp.where(v == 0, jnp.float32(0), v), jnp.int32)
  return bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))


def select_top_per_column(values: jax.Array, counts: jax.Array) -> jax.Array:
  """Mask of the ``counts[e]`` largest entries of each column of ``values`` (T, E) float32.

  Ties are broken by row order (earlier rows first), so the mask equals
  ``position < counts`` where ``position`` is each row's place in a stable descending sort of
  its column -- without sorting: a 32-step bisection over order-preserving int32 keys finds each
  column's threshold (the counts[e]-th largest key), then rows above it, and the earliest rows
  equal to it, are kept. Costs 32 reductions over (T, E) instead of an (T, E) argsort.
  counts: (E,) int32 in [0, T].
  """
  key = _ordered_key(values)
  lo = jnp.min(key, axis=0)  # count(key >= lo) = T >= counts
  hi = jnp.max(key, axis=0)  # answer in [lo, hi]; search for the largest t with count >= r

  def step(_, bounds):
    lo, hi = bounds
    # Upper midpoint in uint32 arithmetic: hi - lo can exceed the int32 range.
    half = ((hi - lo).astype(jnp.uint32) + 1) >> 1
    mid = lo + half.astype(jnp.int32)
    ok = jnp.sum(key >= mid[None, :], axis=0, dtype=jnp.int32) >= counts
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  thresh, _ = jax.lax.fori_loop(0, 32, step, (lo, hi))
  above = key > thresh[None, :]
  at = key == thresh[None, :]
  room = counts - jnp.sum(above, axis=0, dtype=jnp.int32)  # ties to take, earliest rows first
  keep = above | (at & (jnp.cumsum(at, axis=0, dtype=jnp.int32) <= room[None, :]))
  return keep & (counts > 0)[None, :]


def route(x: jax.Array, router_w: jax.Array, *, top_k: int, renormalize: bool = True,
          routing: str | TokenRounding = "topk", impl: str = "xla",
          logit_bias: jax.Array | None = None, interpret: bool = False,
          return_mean_probs: bool = False) -> RoutingPlan | tuple[RoutingPlan, jax.Array]:
  """Router GEMM + routing: x (T, d), router_w (d, E) -> RoutingPlan. See ``route_logits``.

  logit_bias: optional (E,) float added to the fp32 logits before the softmax.
  return_mean_probs: also return mean_t softmax(logits)_t (E,) fp32, the router statistic of
    the load-balancing loss (``load_balancing_loss_from_mean``), differentiable, without a
    (T, E) tensor kept for its backward either.

  The plan is the one ``route_logits(router_logits(x, router_w) + logit_bias, ...)`` makes, bit
  for bit. For top-K routing the gradient keeps no (T, E) tensor for the backward
  (``router_top_k``): renormalized scores (the default) differentiate from the (T, K) scores
  alone; with ``renormalize=False`` or ``return_mean_probs`` the router GEMM is recomputed from
  x and router_w there, T·d·E multiply-adds instead of T·E fp32 values held through the expert
  block's backward. Token rounding needs the full
  probabilities to pick its extra tokens and differentiates through them as ``route_logits``.
  """
  validate_router_args(x, router_w)
  num_experts = router_w.shape[1]
  rounding = validate_routing_args(np.zeros((1, num_experts), np.float32), top_k, routing)
  _validate_logit_bias(logit_bias, num_experts)
  if rounding is not None:
    logits = biased_router_logits(x, router_w, logit_bias)
    plan = route_logits(logits, top_k=top_k, renormalize=renormalize, routing=rounding,
                        impl=impl, interpret=interpret)
    if not return_mean_probs:
      return plan
    return plan, jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
  if impl != "xla":
    from sonic_jax import triton as triton_routing
    impl = triton_routing.resolve_route_impl(impl)
  scores, top_e, *mean_p = _router_top_k(x, router_w, int(top_k), logit_bias, impl,
                                         bool(interpret), bool(return_mean_probs),
                                         bool(renormalize))
  plan = plan_from_top_k(scores, top_e, num_experts, False, impl, interpret)
  return (plan, mean_p[0]) if return_mean_probs else plan


def plan_from_top_k(top_p, top_e, num_experts: int, renormalize: bool, impl: str,
                    interpret: bool = False, config=None) -> RoutingPlan:
  """Top-K probabilities / experts (T, K) -> RoutingPlan (scores renormalized if asked); the
  metadata from XLA (impl "xla") or from ``sonic_jax.triton.plan_from_assignments`` (with its
  ``MetadataConfig`` ``config``)."""
  num_tokens, top_k = top_p.shape
  scores = renormalize_top_k(top_p) if renormalize else top_p
  token_ids = jnp.repeat(jnp.arange(num_tokens, dtype=jnp.int32), top_k)
  args = (token_ids, top_e.reshape(-1), scores.reshape(-1))
  if impl == "xla":
    return RoutingPlan.from_assignments(*args, num_tokens=num_tokens, num_experts=num_experts,
                                        top_k=top_k)
  from sonic_jax import triton as triton_routing
  return triton_routing.plan_from_assignments(*args, num_tokens=num_tokens,
                                              num_experts=num_experts, top_k=top_k, impl=impl,
                                              config=config, interpret=interpret)


def _validate_logit_bias(logit_bias, num_experts: int) -> None:
  if logit_bias is None:
    return
  if getattr(logit_bias, "shape", None) != (num_experts,) or not _is_float(logit_bias):
    raise ValueError(f"logit_bias must be None or a float array of shape (E,) = ({num_experts},), "
                     f"got {getattr(logit_bias, 'dtype', type(logit_bias).__name__)} of shape "
                     f"{jnp.shape(logit_bias)}")


def biased_router_logits(x: jax.Array, router_w: jax.Array,
                         logit_bias: jax.Array | None = None) -> jax.Array:
  """``router_logits(x, router_w)`` (T, E) fp32, plus ``logit_bias`` (E,) when given."""
  logits = router_logits(x, router_w)
  return logits if logit_bias is None else logits + logit_bias.astype(jnp.float32)


def softmax_top_k_grad(logits: jax.Array, top_p: jax.Array, top_e: jax.Array,
                       g_p: jax.Array) -> jax.Array:
  """Cotangent of the logits (T, E) fp32 from that of p = softmax(logits) at top_e (T, K).

  d p_i / d l_j = p_i (δ_ij - p_j), so dl = scatter(g·p) - softmax(l) · Σ_k g_k p_k. The
  scatter is a compare against each row's K experts (distinct, so at most one term is nonzero:
  the scatter-add's bits), which XLA fuses with the softmax instead of a separate scatter.
  """
  return _top_k_grad_from_probs(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), top_p,
                                top_e, g_p)


def _top_k_grad_from_probs(p_full, top_p, top_e, g_p):
  """``softmax_top_k_grad`` given p_full = softmax(logits) (T, E) fp32."""
  gp = g_p.astype(jnp.float32) * top_p
  dl = -p_full * jnp.sum(gp, axis=-1, keepdims=True)
  return dl + _scatter_top_k(gp, top_e, p_full.shape[1])


def renormalize_top_k(top_p: jax.Array) -> jax.Array:
  """Top-K probabilities (T, K) divided by their sum: softmax over the K selected logits."""
  return top_p / jnp.sum(top_p, axis=-1, keepdims=True)


def _scatter_top_k(vals: jax.Array, top_e: jax.Array, num_experts: int) -> jax.Array:
  """(T, K) values at experts top_e (T, K, distinct per row) -> (T, E), zero elsewhere.

  A compare against each row's K experts (at most one term nonzero, so the scatter-add's bits),
  which XLA fuses with its producer and consumer instead of a separate scatter.
  """
  hit = top_e[:, None, :] == jnp.arange(num_experts, dtype=top_e.dtype)[None, :, None]
  return jnp.sum(jnp.where(hit, vals[:, None, :], 0.0), axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 4, 5, 6, 7))
def _router_top_k(x, router_w, top_k, logit_bias, impl, interpret, with_mean, renormalize):
  return _router_top_k_fwd(x, router_w, top_k, logit_bias, impl, interpret, with_mean,
                           renormalize)[0]


def _router_top_k_fwd(x, router_w, top_k, logit_bias, impl, interpret, with_mean, renormalize):
  logits = biased_router_logits(x, router_w, logit_bias)
  if impl == "xla":
    top_p, top_e = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
  else:
    from sonic_jax.triton.topk import topk_softmax
    top_p, top_e = topk_softmax(logits, top_k, impl=impl, interpret=interpret)
  out = (renormalize_top_k(top_p) if renormalize else top_p, top_e)
  if with_mean:
    out += (jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0),)
  # The residuals are the inputs (alive anyway: x for the expert block's backward, the weights
  # as parameters) and the (T, K) selection, not the (T, E) logits.
  return out, (x, router_w, logit_bias, top_p, top_e)


def _router_top_k_bwd(top_k, impl, interpret, with_mean, renormalize, res, g):
  del top_k, impl, interpret
  x, router_w, logit_bias, top_p, top_e = res
  g_m = g[2] if with_mean else None
  # The barrier keeps XLA from merging a recomputed router GEMM with the forward's (CSE would
  # keep the forward's logits alive until here) and, through the cotangent, from hoisting the
  # router's backward before the expert block's backward has produced the scores' gradient.
  x, router_w, logit_bias, top_p, g_s, g_m = jax.lax.optimization_barrier(
      (x, router_w, logit_bias, top_p, g[0], g_m))
  dl = router_logit_grad(x, router_w, logit_bias, top_p, top_e, g_s, g_m,
                         renormalize=renormalize)
  return (router_dx(x, router_w, dl), router_dw(x, router_w, dl),
          router_bias_grad(logit_bias, dl))


def router_logit_grad(x: jax.Array, router_w: jax.Array, logit_bias: jax.Array | None,
                      top_p: jax.Array, top_e: jax.Array, g_s: jax.Array,
                      g_m: jax.Array | None = None, *, renormalize: bool) -> jax.Array:
  """Cotangent of the (biased) router logits, (T, E) fp32, without saved logits.

  top_p, top_e (T, K): the forward's top-K probabilities (raw) and experts; g_s (T, K): the
  cotangent of the scores (top_p renormalized when ``renormalize``, else top_p); g_m (E,) or
  None: that of the mean probabilities.
  """
  g_s = g_s.astype(jnp.float32)
  if renormalize and g_m is None:
    # s = softmax over the K selected (biased) logits, so ds_k / dl_j = s_k (δ_kj - s_j) for
    # selected j and 0 elsewhere: dl needs only the (T, K) scores, not the (T, E) softmax, so
    # the router GEMM is not recomputed (with the softmax fusion about 50 µs of the 3.62 ms
    # step at 7B-n256 in the H200 profile kernel-profile-h200-2026-12-04-s15f.log).
    s = renormalize_top_k(top_p)
    return _scatter_top_k(s * (g_s - jnp.sum(s * g_s, axis=-1, keepdims=True)), top_e,
                          router_w.shape[1])
  if renormalize:  # the cotangent of the raw top-K probabilities
    g_s = jax.vjp(renormalize_top_k, top_p)[1](g_s)[0]
  p_full = jax.nn.softmax(biased_router_logits(x, router_w, logit_bias), axis=-1)
  dl = _top_k_grad_from_probs(p_full, top_p, top_e, g_s)
  if g_m is not None:  # d mean_t p_t / d l_t = p_t (g - <p_t, g>) / T
    g_m = g_m.astype(jnp.float32)[None, :]
    dl = dl + p_full * (g_m - jnp.sum(p_full * g_m, axis=-1, keepdims=True)) / x.shape[0]
  return dl


# The router GEMM's transposes take dl in the operands' dtype (bf16 in training), fp32
# accumulation: dx and d router_w are rounded to that dtype anyway, and autodiff's fp32 dl made
# both fp32 GEMMs that ran at a third of the bandwidth bound on an H200 (37 µs each at
# T = 40960, d = 768). jax.vjp, not hand-written dots: inside shard_map it sums a replicated
# router_w's (and bias's) cotangent over the axes x varies along, as autodiff does.
def _router_dot(x, router_w):
  cd = jnp.result_type(x, router_w)
  return jnp.dot(x.astype(cd), router_w.astype(cd), preferred_element_type=cd)


def router_dx(x: jax.Array, router_w: jax.Array, dl: jax.Array) -> jax.Array:
  """dl (T, E) · router_wᵀ -> (T, d) in x.dtype: the router's share of x's gradient."""
  _, pull = jax.vjp(lambda x: _router_dot(x, router_w), x)
  return pull(dl.astype(jnp.result_type(x, router_w)))[0].astype(x.dtype)


def router_dw(x: jax.Array, router_w: jax.Array, dl: jax.Array) -> jax.Array:
  """xᵀ · dl -> (d, E) in router_w.dtype: router_w's gradient."""
  _, pull = jax.vjp(lambda w: _router_dot(x, w), router_w)
  return pull(dl.astype(jnp.result_type(x, router_w)))[0].astype(router_w.dtype)


def router_bias_grad(logit_bias: jax.Array | None, dl: jax.Array) -> jax.Array | None:
  """Σ_t dl (E,) in logit_bias' dtype (None without a bias), through jax.vjp as above."""
  if logit_bias is None:
    return None
  _, pull = jax.vjp(lambda b: jnp.zeros_like(dl) + b.astype(jnp.float32), logit_bias)
  return pull(dl)[0]


_router_top_k.defvjp(_router_top_k_fwd, _router_top_k_bwd)


def router_top_k(x: jax.Array, router_w: jax.Array, top_k: int, *,
                 logit_bias: jax.Array | None = None, impl: str = "xla",
                 interpret: bool = False, mean_probs: bool = False,
                 renormalize: bool = False) -> tuple[jax.Array, ...]:
  """Router GEMM, softmax and top-K without keeping the logits for the backward.

  x (T, d), router_w (d, E), logit_bias (E,) or None -> (probs (T, K) fp32, experts (T, K)
  int32), best first: p = softmax(x · router_w + logit_bias) at the K largest; with
  ``mean_probs`` also mean_t p_t (E,) fp32 over all experts (for the load-balancing loss, see
  ``load_balancing_loss_from_mean``). With ``renormalize`` the probabilities come divided by
  their sum over the K (the softmax over the selected logits). Differentiable in x, router_w and
  logit_bias. The backward keeps no (T, E) tensor: it recomputes the logits from its inputs,
  once for both outputs, except for renormalized scores without ``mean_probs``, whose gradient
  needs only the (T, K) scores.
  impl: "xla" (``lax.top_k``), "jax_triton" or "pallas_triton" (``sonic_jax.triton.topk_softmax``).
  """
  validate_router_args(x, router_w)
  validate_routing_args(np.zeros((1, router_w.shape[1]), np.float32), top_k, "topk")
  _validate_logit_bias(logit_bias, router_w.shape[1])
  if impl not in ("xla", "jax_triton", "pallas_triton"):
    raise ValueError(f"impl must be 'xla', 'jax_triton' or 'pallas_triton', got {impl!r}")
  return _router_top_k(x, router_w, int(top_k), logit_bias, impl, bool(interpret),
                       bool(mean_probs), bool(renormalize))


def validate_router_args(x, router_w) -> None:
  if getattr(x, "ndim", None) != 2:
    raise ValueError(f"x must have shape (T, d), got shape {jnp.shape(x)}")
  if not _is_float(x):
    raise ValueError(f"x must be floating point, got dtype {jnp.result_type(x)}")
  if getattr(router_w, "ndim", None) != 2 or router_w.shape[0] != x.shape[1]:
    raise ValueError(
        f"router_w must have shape (d, E) with d = x.shape[1] = {x.shape[1]}, got shape "
        f"{jnp.shape(router_w)}")
  if not _is_float(router_w):
    raise ValueError(f"router_w must be floating point, got dtype {jnp.result_type(router_w)}")


def load_balancing_loss(logits: jax.Array, plan: RoutingPlan) -> jax.Array:
  """Switch-style auxiliary loss E · Σ_e mean_t softmax(logits)_e · f_e / Σ f (fp32 scalar).

  Equals 1 for perfectly uniform routing; gradients flow through the softmax only.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  return load_balancing_loss_from_mean(jnp.mean(probs, axis=0), plan)


def load_balancing_loss_from_mean(mean_probs: jax.Array, plan: RoutingPlan) -> jax.Array:
  """``load_balancing_loss`` from mean_t softmax(logits)_t (E,), e.g. ``route(...,
  return_mean_probs=True)``'s: E · Σ_e mean_probs_e · f_e / Σ f (fp32 scalar)."""
  return balance_loss(mean_probs, plan.group_sizes)


def balance_loss(mean_probs: jax.Array, group_sizes: jax.Array) -> jax.Array:
  """E · Σ_e mean_probs_e · f_e / Σ f for mean_probs (E,) and the experts' pair counts f (E,)
  (no gradient through f): ``load_balancing_loss_from_mean``'s formula, for callers that sum
  mean_probs and f over devices first (``sharded_moe``)."""
  freq = group_sizes.astype(jnp.float32)
  freq = freq / jnp.maximum(jnp.sum(freq), 1.0)
  return mean_probs.shape[0] * jnp.sum(mean_probs.astype(jnp.float32) *
                                       jax.lax.stop_gradient(freq))


def wasted_ratio(plan: RoutingPlan, tile: int) -> jax.Array:
  """(Σ_e ceil(f_e/tile)·tile − Σ_e f_e) / Σ_e f_e: padding a tiled grouped GEMM computes."""
  f = plan.group_sizes
  return jnp.sum(-(-f // tile) * tile - f) / jnp.maximum(jnp.sum(f), 1)


__all__ = ["RoutingPlan", "TokenRounding", "route", "route_logits", "router_logits",
           "router_top_k", "plan_from_top_k", "biased_router_logits", "softmax_top_k_grad",
           "load_balancing_loss", "load_balancing_loss_from_mean", "balance_loss", "wasted_ratio"]
