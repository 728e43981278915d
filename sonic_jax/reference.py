"""Naive dense reference: one-hot dispatch over all experts in float32 (tests only).

Independent of the routing plan machinery: it builds a dense (T, E) gate matrix from its own
top-K, runs every expert on every token and mixes. Use small shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sonic_jax.routing import RoutingPlan


def dense_gates(x, router_w, top_k: int, renormalize: bool = True) -> jax.Array:
  """(T, E) fp32 gate matrix: score of each selected expert, 0 elsewhere."""
  logits = jnp.dot(x.astype(jnp.float32), router_w.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)
  probs = jax.nn.softmax(logits, axis=-1)
  _, idx = jax.lax.top_k(jax.lax.stop_gradient(probs), top_k)
  mask = jnp.sum(jax.nn.one_hot(idx, probs.shape[-1], dtype=jnp.float32), axis=1)
  gates = probs * mask
  if renormalize:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return gates


def plan_gates(plan: RoutingPlan) -> jax.Array:
  """(T, E) fp32 gate matrix of an arbitrary plan (differentiable in plan.scores)."""
  valid = plan.valid_mask()
  return jnp.zeros((plan.num_tokens, plan.num_experts), jnp.float32).at[
      plan.token_ids, plan.expert_ids].add(jnp.where(valid, plan.scores, 0.0))


def dense_experts(x, gates, w1, w2) -> jax.Array:
  """Σ_e gates[:, e] · SwiGLU(x · w1[e]) · w2[e] for all experts, fp32, HIGHEST precision."""
  f32 = jnp.float32
  hp = jax.lax.Precision.HIGHEST
  h = jnp.einsum("td,edf->etf", x.astype(f32), w1.astype(f32), precision=hp)
  n = h.shape[-1] // 2
  a = jax.nn.silu(h[..., :n]) * h[..., n:]
  y = jnp.einsum("etn,end->etd", a, w2.astype(f32), precision=hp)
  return jnp.einsum("te,etd->td", gates, y, precision=hp)


def moe_reference(x, router_w, w1, w2, *, top_k: int, renormalize: bool = True) -> jax.Array:
  """Dense float32 top-K MoE (the ground truth for ``sonic_jax.moe(..., routing="topk")``)."""
  return dense_experts(x, dense_gates(x, router_w, top_k, renormalize), w1, w2)
