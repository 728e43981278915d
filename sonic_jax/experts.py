"""The expert block as one ``jax.custom_vjp`` with SonicMoE's minimal-activation backward.

Forward: up_proj (gather + grouped GEMM + SwiGLU -> H, A), down_proj (A·W2 -> Y, transient),
combine (out_t = Σ_k s_tk · Y_tk). Saved for backward: x, H, the fp32 scores and the routing plan
(plus the weights, which are parameters, not activations). Never gathered x, A or Y.

Backward: dh (dA' = gathered dO · W2ᵀ; A recomputed from H; dS = ⟨dA', A⟩; dH = s·dSwiGLU(dA');
A' = s·A), dw2, dx_pairs, dw1, combine for dx. The router-score gradient is dS, so Y is never
needed; the router backward (dS -> dlogits) is plain JAX autodiff outside this block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

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
    h, a = kernels.up_proj(x, w1, plan)
    y = kernels.down_proj(a, w2, plan)
    out = kernels.combine(y, plan, scores, out_dtype=x.dtype)
    return out, (x, h, scores, w1, w2, plan)

  def bwd(res, dout):
    x, h, scores, w1, w2, plan = res
    dout = dout.astype(x.dtype)
    s_grouped = scores[plan.scatter_idx]
    dh, a_prime, ds = kernels.dh(dout, w2, h, s_grouped, plan)
    dw2 = kernels.dw2(dout, a_prime, plan)
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
      dx = kernels.combine(dx_pairs, plan, None, out_dtype=x.dtype)
      gather_idx, reverse_idx, _, _ = jax.lax.optimization_barrier(
          (plan.gather_idx, plan.reverse_idx, dx, dw2))
      dw1 = kernels.dw1(x, dh, plan.replace(gather_idx=gather_idx, reverse_idx=reverse_idx))
      # The scores' gradient only after dW1: the router's backward, which recomputes the
      # (T, E) logits (routing.router_top_k), then runs once the (P, ·) buffers are dead
      # instead of beside them (XLA put it next to dW1: H200 memory report, Qwen3-30B-A3B).
      ds, _ = jax.lax.optimization_barrier((ds, dw1))
    else:
      dx_pairs = kernels.dx_pairs(dh, w1, plan)
      dw1 = kernels.dw1(x, dh, plan)
      dx = kernels.combine(dx_pairs, plan, None, out_dtype=x.dtype)
    dscores = jnp.where(plan.valid_mask(), ds[plan.reverse_idx], 0.0).astype(scores.dtype)
    zero_plan = jax.tree.map(_zero_cotangent, plan)
    return dx, dscores, dw1.astype(w1.dtype), dw2.astype(w2.dtype), zero_plan

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
    backend: "auto", "xla", "pallas", "ffi" or an ExpertKernels instance ("auto": per call, the
      fastest available backend that accepts these shapes and dtypes; ``select_backend``).
  Returns:
    (T, d) in x.dtype: out_t = Σ_k s_tk · SwiGLU(x_t · W1_e) · W2_e.
  """
  validate_expert_args(x, plan, w1, w2)
  kernels = select_backend(backend, x, plan, w1, w2)
  # The scores travel as their own differentiable argument; the plan keeps only index arrays.
  args = _match_varying_axes(x, plan.scores, w1, w2, plan.replace(scores=jnp.zeros((0,))))
  return _expert_block(kernels)(*args)


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
