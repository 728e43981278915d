"""The expert block as one ``jax.custom_vjp`` with SonicMoE's minimal-activation backward.

Forward: up_proj (gather + grouped GEMM + SwiGLU -> H, A), down_proj (A·W2 -> Y, transient),
combine (out_t = Σ_k s_tk · Y_tk). Saved for backward: x, H, the fp32 scores and the routing plan
(plus the weights, which are parameters, not activations). Never gathered x, A or Y.

Backward: dh (dA' = gathered dO · W2ᵀ; A recomputed from H; dS = ⟨dA', A⟩; dH = s·dSwiGLU(dA');
A' = s·A), dw2, dx_pairs, dw1, combine for dx. The router-score gradient is dS, so Y is never
needed. ``moe_experts`` returns dS as the scores' cotangent (the router's backward is then
autodiff's, outside); ``moe_top_k`` (top-K routing, what ``sonic_jax.moe`` runs) owns the router's
backward too: dS -> dlogits -> the router's x-gradient as the addend of the dx combine.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from sonic_jax import routing
from sonic_jax.backends import select_backend
from sonic_jax.kernels import ExpertKernels
from sonic_jax.routing import RoutingPlan


class _Sequential:
  """Kernel entry points wrapped so that vmap runs them as a loop over the batch.

  Grouped-GEMM kernels take per-call group metadata, so an outer vmap cannot become one wider
  kernel; ``sequential_vmap`` maps each call over the batch instead.
  """

  def __init__(self, kernels: ExpertKernels):
    self._k = kernels

  def __getattr__(self, name):
    fn = getattr(self._k, name)
    return lambda *args, **kw: jax.custom_batching.sequential_vmap(
        functools.partial(fn, **kw))(*args)


def _forward(kernels, x, scores, w1, w2, plan):
  """Training forward: (out (T, d), residuals x, H, scores, weights, plan)."""
  h, a = kernels.up_proj(x, w1, plan)
  y = kernels.down_proj(a, w2, plan)
  out = kernels.combine(y, plan, scores, out_dtype=x.dtype)
  return out, (x, h, scores, w1, w2, plan)


def _backward(backend: ExpertKernels, kernels, res, dout, router_dx=None):
  """The expert block's backward: (dx (T, d), dS (P,) fp32 grouped, dW1, dW2, carry).

  router_dx: None, or a function of dS returning (the router's x-gradient (T, d), carry): it
  runs once dX_pairs exists and its result joins the dx combine (``combine_add``), instead of
  an add kernel after the backward; carry (the router's weight and bias gradients, computed
  from the same (T, E) logit cotangent) is computed before dW1 and returned.
  """
  x, h, scores, w1, w2, plan = res
  dout = dout.astype(x.dtype)
  s_grouped = scores[plan.scatter_idx]
  dh, a_prime, ds = kernels.dh(dout, w2, h, s_grouped, plan)
  dw2 = kernels.dw2(dout, a_prime, plan)

  def combine_dx(dx_pairs, ds):
    if router_dx is None:
      return kernels.combine(dx_pairs, plan, None, out_dtype=x.dtype), None
    addend, carry = router_dx(ds)
    return kernels.combine_add(dx_pairs, plan, addend, out_dtype=x.dtype), carry

  if backend.dw1_last:
    # Peak memory (see ExpertKernels.dw1_last): dX_pairs only after dW2, so that dO's
    # gathered rows (dh, dW2) are dead before the (P, d) dX_pairs is allocated (XLA ran
    # dx_pairs first: H200 memory report, paper-1.4B-n512); x gathered for dW1 only once
    # dX_pairs is dead too. Only small arrays go through the barriers (a large operand that
    # stays live past one may be copied; the whole plan crashed XLA's CPU compiler inside
    # shard_map): the group sizes and offsets, and the row indices for a gather by
    # gather_idx or a scatter by reverse_idx.
    sizes, offsets, _ = jax.lax.optimization_barrier(
        (plan.group_sizes, plan.group_offsets, dw2))
    dx_pairs = kernels.dx_pairs(dh, w1, plan.replace(group_sizes=sizes, group_offsets=offsets))
    # The router's x-gradient (a (T, d) addend) only once dX_pairs exists, not beside dW2.
    ds_now = ds if router_dx is None else jax.lax.optimization_barrier((ds, dx_pairs))[0]
    dx, carry = combine_dx(dx_pairs, ds_now)
    # carry (e.g. the router's weight gradient) is computed here too, not deferred past dW1
    # with its (T, E) input alive.
    gather_idx, reverse_idx, _, _, carry = jax.lax.optimization_barrier(
        (plan.gather_idx, plan.reverse_idx, dx, dw2, carry))
    dw1 = kernels.dw1(x, dh, plan.replace(gather_idx=gather_idx, reverse_idx=reverse_idx))
    # moe_experts: the scores' gradient only after dW1, so that the router's backward outside
    # (autodiff's, which may recompute the (T, E) logits: routing.router_top_k) runs once the
    # (P, ·) buffers are dead instead of beside them (XLA put it next to dW1: H200 memory
    # report, Qwen3-30B-A3B). moe_top_k's router gradients are in carry, before dW1.
    if router_dx is None:
      ds, _ = jax.lax.optimization_barrier((ds, dw1))
  else:
    dx_pairs = kernels.dx_pairs(dh, w1, plan)
    dw1 = kernels.dw1(x, dh, plan)
    dx, carry = combine_dx(dx_pairs, ds)
  return dx, ds, dw1.astype(w1.dtype), dw2.astype(w2.dtype), carry


def _flat_scores_grad(ds: jax.Array, plan: RoutingPlan) -> jax.Array:
  """dS (P,) in grouped order -> (P,) fp32 in flat order, 0 on padding."""
  return jnp.where(plan.valid_mask(), ds[plan.reverse_idx], 0.0)


@functools.cache
def _expert_block(backend: ExpertKernels):
  """custom_vjp expert block bound to one backend (cached per backend instance)."""
  kernels = _Sequential(backend)

  @jax.custom_vjp
  def block(x, scores, w1, w2, plan):
    h, a = kernels.up_proj(x, w1, plan, inference=True)
    del h
    y = kernels.down_proj(a, w2, plan)
    return kernels.combine(y, plan, scores, out_dtype=x.dtype)

  def fwd(x, scores, w1, w2, plan):
    return _forward(kernels, x, scores, w1, w2, plan)

  def bwd(res, dout):
    scores, plan = res[2], res[5]
    dx, ds, dw1, dw2, _ = _backward(backend, kernels, res, dout)
    dscores = _flat_scores_grad(ds, plan).astype(scores.dtype)
    return dx, dscores, dw1, dw2, jax.tree.map(_zero_cotangent, plan)

  block.defvjp(fwd, bwd)
  return block


@functools.cache
def _routed_block(backend: ExpertKernels, renormalize: bool):
  """custom_vjp of top-K routing's scores and the expert block together, bound to one backend.

  block(x, router_w, logit_bias, w1, w2, top_p, mean_p, plan) -> (out, mean_p). top_p (T, K)
  (the raw top-K probabilities), mean_p (E,) or None and the plan come from the router's
  forward run outside (without gradient); the backward differentiates the scores and mean_p
  into x, router_w and logit_bias itself (``routing.router_logit_grad``), so that the router's
  x-gradient joins the experts' dx in the dx combine rather than in an add kernel after it.
  """
  kernels = _Sequential(backend)

  def scores_of(top_p):
    return (routing.renormalize_top_k(top_p) if renormalize else top_p).reshape(-1)

  @jax.custom_vjp
  def block(x, router_w, logit_bias, w1, w2, top_p, mean_p, plan):
    return _expert_block(backend)(x, scores_of(top_p), w1, w2, plan), mean_p

  def fwd(x, router_w, logit_bias, w1, w2, top_p, mean_p, plan):
    out, res = _forward(kernels, x, scores_of(top_p), w1, w2, plan)
    return (out, mean_p), (res, router_w, logit_bias, top_p)

  def bwd(res, cts):
    res, router_w, logit_bias, top_p = res
    dout, g_m = cts
    x, plan = res[0], res[5]
    top_e = plan.expert_ids.reshape(top_p.shape)

    def router_dx(ds):
      # The router's inputs pass a barrier with dS: a recomputed router GEMM (raw
      # probabilities or mean_p's gradient) is then neither merged with the forward's (CSE
      # would keep the (T, E) logits alive) nor hoisted. dl (T, E) gives the router's dx, the
      # dx combine's addend, and its weight and bias gradients here, once: carrying dl past
      # dW1 sat at the step's peak (+7 MiB at Qwen3-30B-A3B, session-26 memory report), and
      # carrying the (T, K) cotangent instead recomputed dl (and with raw probabilities or
      # mean_p, the router GEMM and softmax) after dW1.
      g_s = _flat_scores_grad(ds, plan).reshape(top_p.shape)
      xb, rwb, bb, pb, g = jax.lax.optimization_barrier((x, router_w, logit_bias, top_p, g_s))
      dl = routing.router_logit_grad(xb, rwb, bb, pb, top_e, g, g_m, renormalize=renormalize)
      return routing.router_dx(xb, rwb, dl), (routing.router_dw(xb, rwb, dl),
                                              routing.router_bias_grad(logit_bias, dl))

    dx, _, dw1, dw2, (drouter_w, dbias) = _backward(backend, kernels, res, dout, router_dx)
    zero = jax.tree.map(_zero_cotangent, (top_p, g_m, plan))
    return (dx, drouter_w, dbias, dw1, dw2, *zero)

  block.defvjp(fwd, bwd)
  return block


def _zero_cotangent(leaf):
  if jnp.issubdtype(leaf.dtype, jnp.floating):
    return jnp.zeros_like(leaf)
  return None


def validate_expert_args(x, plan: RoutingPlan, w1, w2) -> None:
  """Raises ValueError naming the argument for bad shapes or dtypes, before any compute."""
  if not isinstance(plan, RoutingPlan):
    raise ValueError(f"plan must be a sonic_jax.RoutingPlan, got {type(plan).__name__}")
  for name, arr, ndim in (("x", x, 2), ("w1", w1, 3), ("w2", w2, 3)):
    if getattr(arr, "ndim", None) != ndim:
      raise ValueError(f"{name} must have rank {ndim}, got shape {jnp.shape(arr)}")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, got dtype {arr.dtype}")
  t, d = x.shape
  e = plan.num_experts
  if t != plan.num_tokens:
    raise ValueError(f"x has {t} tokens but the plan routes {plan.num_tokens}")
  if w1.shape[0] != e or w2.shape[0] != e:
    raise ValueError(
        f"w1 and w2 must have num_experts = {e} leading rows (router_w.shape[1]), got "
        f"w1 {w1.shape}, w2 {w2.shape}")
  if w1.shape[1] != d or w1.shape[2] % 2:
    raise ValueError(f"w1 must have shape (E, d={d}, 2n), got {w1.shape}")
  n = w1.shape[2] // 2
  if w2.shape[1:] != (n, d):
    raise ValueError(f"w2 must have shape (E, n={n}, d={d}) to match w1 {w1.shape}, got "
                     f"{w2.shape}")
  if len({x.dtype, w1.dtype, w2.dtype}) != 1:
    raise ValueError(f"x, w1 and w2 must share a dtype, got {x.dtype}, {w1.dtype}, {w2.dtype}")


def moe_experts(x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array, *,
                backend: str | ExpertKernels = "auto") -> jax.Array:
  """Expert block for callers who route themselves.

  Args:
    x: (T, d) tokens.
    plan: RoutingPlan from ``sonic_jax.route`` / ``route_logits`` / ``RoutingPlan.from_assignments``;
      gradients flow into ``plan.scores``.
    w1: (E, d, 2n) gate | up weights (``sonic_jax.fuse_gate_up``); w2: (E, n, d).
    backend: "auto", "xla", "pallas", "ffi", a ``backends.COMBINED`` name ("pallas+ffi",
      "pallas+ffi-wgrad") or an ExpertKernels instance ("auto": per call, the fastest available
      backend that accepts these shapes and dtypes; ``select_backend``).
  Returns:
    (T, d) in x.dtype: out_t = Σ_k s_tk · SwiGLU(x_t · W1_e) · W2_e.
  """
  validate_expert_args(x, plan, w1, w2)
  kernels = select_backend(backend, x, plan, w1, w2)
  # The scores travel as their own differentiable argument; the plan keeps only index arrays.
  args = _match_varying_axes(x, plan.scores, w1, w2, plan.replace(scores=jnp.zeros((0,))))
  return _expert_block(kernels)(*args)


def moe_top_k(x: jax.Array, router_w: jax.Array, w1: jax.Array, w2: jax.Array, *, top_k: int,
              renormalize: bool = True, logit_bias: jax.Array | None = None,
              return_mean_probs: bool = False, backend: str | ExpertKernels = "auto",
              routing_impl: str = "xla", interpret: bool = False
              ) -> tuple[jax.Array, RoutingPlan, jax.Array | None]:
  """Top-K routing and the expert block differentiated as one (what ``sonic_jax.moe`` runs).

  Same values and gradients as ``route(x, router_w, ...)`` followed by ``moe_experts``, but one
  custom_vjp owns both backwards: the router's x-gradient (dl · router_wᵀ) is the addend of the
  experts' dx combine (``ExpertKernels.combine_add``) instead of an add kernel after the
  backward, and renormalized scores need no recomputed router GEMM.

  Args: x (T, d), router_w (d, E), w1 (E, d, 2n), w2 (E, n, d), as ``moe``; logit_bias (E,) or
    None, return_mean_probs, routing_impl ("xla", "auto", "jax_triton", "pallas_triton") as
    ``route``.
  Returns:
    (out (T, d), plan, mean_probs (E,) fp32 or None). The plan's scores carry no gradient (the
    block differentiates them); mean_probs does (for ``load_balancing_loss_from_mean``).
  """
  routing.validate_router_args(x, router_w)
  num_experts = router_w.shape[1]
  if getattr(w1, "ndim", None) == 3 and w1.shape[0] != num_experts:
    raise ValueError(f"router_w has {num_experts} experts but w1 has {w1.shape[0]} (w1.shape[0] "
                     f"must equal router_w.shape[1])")
  if routing_impl != "xla":
    from sonic_jax import triton as triton_routing
    routing_impl = triton_routing.resolve_route_impl(routing_impl)
  sg = jax.lax.stop_gradient
  top_p, top_e, *mean_p = routing.router_top_k(
      sg(x), sg(router_w), top_k, logit_bias=None if logit_bias is None else sg(logit_bias),
      impl=routing_impl, interpret=interpret, mean_probs=return_mean_probs)
  mean_p = mean_p[0] if return_mean_probs else None
  plan = routing.plan_from_top_k(top_p, top_e, num_experts, renormalize, routing_impl, interpret)
  validate_expert_args(x, plan, w1, w2)
  kernels = select_backend(backend, x, plan, w1, w2)
  args = _match_varying_axes(x, router_w, logit_bias, w1, w2, top_p, mean_p,
                             plan.replace(scores=jnp.zeros((0,))))
  out, mean_p = _routed_block(kernels, bool(renormalize))(*args)
  return out, plan, mean_p


def _varying_axes(a) -> frozenset:
  mat = getattr(jax.typeof(a), "manual_axis_type", None)
  return frozenset(getattr(mat, "varying", ()))


def _match_varying_axes(*args):
  """Inside shard_map, marks every input varying over the union of the inputs' manual axes.

  A replicated weight used with sharded tokens gets a sharded cotangent; casting it to varying
  outside the custom_vjp lets autodiff of the cast insert the psum that makes it replicated.
  """
  leaves, tree = jax.tree.flatten(args)
  vma = frozenset().union(*(_varying_axes(a) for a in leaves))
  if not vma:
    return args
  out = []
  for a in leaves:
    missing = tuple(sorted(vma - _varying_axes(a)))
    out.append(jax.lax.pcast(a, missing, to="varying") if missing else a)
  return jax.tree.unflatten(tree, out)
