"""Flax modules: ``MoE`` (NNX) and ``MoELinen`` (Linen) around ``sonic_jax.moe``.

Parameters (logical sharding axes in brackets, see ``LOGICAL_AXES``):
  router (d, E) ["embed", "expert"], w1 (E, d, 2n) ["expert", "embed", "mlp"] holding
  [gate | up], w2 (E, n, d) ["expert", "mlp", "embed"].

Sharded training: pass ``sharding=sonic_jax.sharding.MoESharding(mesh, ...)`` (or set the
attribute later, e.g. with ``sonic_jax.sharding.shard_moe_layers``) and the layer runs through
``sonic_jax.sharding.sharded_moe`` on that mesh; see docs/sharding.md.

Auxiliary load-balancing loss: when ``aux_loss_coef > 0`` the module sows
``aux_loss_coef * load_balancing_loss`` as ``nnx.Intermediate`` named ``"aux_loss"`` (Linen:
collection ``"intermediates"``, name ``"aux_loss"``); ``__call__(x, return_aux_loss=True)``
returns ``(out, aux_loss)`` instead. The loss is computed from ``route(...,
return_mean_probs=True)``, so neither it nor the routing keeps a (T, E) tensor for the backward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen, nnx

from sonic_jax.backends import validate_backend_name
from sonic_jax.experts import moe_experts, moe_top_k
from sonic_jax.kernels import ExpertKernels
from sonic_jax.routing import (TokenRounding, load_balancing_loss_from_mean, route,
                               validate_routing_args)
from sonic_jax.triton import validate_route_impl  # imports without jax-triton

LOGICAL_AXES = {
    "router": ("embed", "expert"),
    "w1": ("expert", "embed", "mlp"),
    "w2": ("expert", "mlp", "embed"),
}

Dtype = Any


def _check_config(d_model, d_ff, num_experts, top_k, routing, backend, aux_loss_coef,
                  sharding=None, routing_impl="auto"):
  for name, v in (("d_model", d_model), ("d_ff", d_ff), ("num_experts", num_experts)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be a positive int, got {v!r}")
  if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
    raise ValueError(f"top_k must satisfy 1 <= top_k <= num_experts ({num_experts}), got {top_k}")
  validate_routing_args(jnp.zeros((1, num_experts)), top_k, routing)
  validate_backend_name(backend)
  validate_route_impl(routing_impl, "routing_impl")
  if aux_loss_coef < 0:
    raise ValueError(f"aux_loss_coef must be >= 0, got {aux_loss_coef}")
  if sharding is not None:
    from sonic_jax.sharding import MoESharding  # sharding.py imports this module
    if not isinstance(sharding, MoESharding):
      raise ValueError(f"sharding must be None or a sonic_jax.sharding.MoESharding, got "
                       f"{type(sharding).__name__}")


def _apply(x, router_w, w1, w2, *, top_k, renormalize, routing, backend, dtype, eval_routing,
           sharding=None, routing_impl="auto", with_aux=True):
  """Shared forward of both modules: x (..., d) -> (out (..., d), aux loss scalar).

  With ``sharding`` the layer runs on its mesh and the aux loss is the global one. Without
  ``with_aux`` the aux loss may be returned as 0 (top-K routing then differentiates the router
  from the (T, K) scores alone, without the mean probabilities' recomputed (T, E) softmax).
  """
  d = router_w.shape[0]
  if x.shape[-1] != d:
    raise ValueError(f"x must have last dimension d_model = {d}, got {x.shape}")
  xt = x.reshape(-1, d).astype(dtype)
  router_w, w1, w2 = router_w.astype(dtype), w1.astype(dtype), w2.astype(dtype)
  routing = "topk" if eval_routing else routing
  if sharding is not None:
    from sonic_jax.sharding import sharded_moe  # sharding.py imports this module
    out, aux = sharded_moe(xt, router_w, w1, w2, sharding=sharding, top_k=top_k,
                           renormalize=renormalize, routing=routing, backend=backend,
                           routing_impl=routing_impl, return_aux_loss=True)
  elif routing == "topk":  # one custom_vjp for the router's and the experts' backward
    out, plan, mean_p = moe_top_k(xt, router_w, w1, w2, top_k=top_k, renormalize=renormalize,
                                  return_mean_probs=with_aux, backend=backend,
                                  routing_impl=routing_impl)
    aux = (load_balancing_loss_from_mean(mean_p, plan) if with_aux
           else jnp.zeros((), jnp.float32))
  else:
    # route() keeps no (T, E) tensor for the backward, for the plan's scores nor for the aux
    # loss's mean probabilities.
    plan, mean_p = route(xt, router_w, top_k=top_k, renormalize=renormalize, routing=routing,
                         impl=routing_impl, return_mean_probs=True)
    out = moe_experts(xt, plan, w1, w2, backend=backend)
    aux = load_balancing_loss_from_mean(mean_p, plan)
  return out.reshape(*x.shape[:-1], d), aux


class MoE(nnx.Module):
  """SwiGLU mixture-of-experts layer (Flax NNX).

  Args:
    d_model: model dim d.  d_ff: expert intermediate dim n.  num_experts: E.  top_k: K.
    rngs: nnx.Rngs for init.  param_dtype: storage dtype of params.  dtype: compute dtype
      (bf16 recommended on GPUs).  renormalize / routing / backend / routing_impl: as
      ``sonic_jax.moe``.
    eval_topk: when True and the module is in eval mode (``model.eval()``), token rounding falls
      back to plain top-K (rounding is a training-time optimization).
    aux_loss_coef: weight of the sown load-balancing loss (0 disables it).
    init_std: normal init std of the experts and router (default 0.02).
    sharding: None, or a ``sonic_jax.sharding.MoESharding`` to run the layer on a mesh.
  Call: x (..., d) -> (..., d) in ``dtype``.
  """

  def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int, *, rngs: nnx.Rngs,
               param_dtype: Dtype = jnp.float32, dtype: Dtype = jnp.float32,
               renormalize: bool = True, routing: str | TokenRounding = "topk",
               backend: str | ExpertKernels = "auto", aux_loss_coef: float = 0.0,
               eval_topk: bool = True, init_std: float = 0.02, sharding=None,
               routing_impl: str = "auto"):
    _check_config(d_model, d_ff, num_experts, top_k, routing, backend, aux_loss_coef, sharding,
                  routing_impl)
    init = nnx.initializers.normal(init_std)
    # Shard eagerly only inside a mesh context; otherwise keep the logical axes as metadata.
    eager = not jax.sharding.get_abstract_mesh().empty

    def param(name, shape):
      return nnx.Param(init(rngs.params(), shape, param_dtype), out_sharding=LOGICAL_AXES[name],
                       eager_sharding=eager)

    self.router = param("router", (d_model, num_experts))
    self.w1 = param("w1", (num_experts, d_model, 2 * d_ff))
    self.w2 = param("w2", (num_experts, d_ff, d_model))
    self.top_k, self.renormalize, self.routing = top_k, renormalize, routing
    self.backend, self.dtype, self.aux_loss_coef = backend, dtype, aux_loss_coef
    self.eval_topk = eval_topk
    self.sharding = sharding
    self.routing_impl = routing_impl
    self.deterministic = False

  def __call__(self, x: jax.Array, *, return_aux_loss: bool = False):
    out, aux = _apply(x, self.router[...], self.w1[...], self.w2[...], top_k=self.top_k,
                      renormalize=self.renormalize, routing=self.routing, backend=self.backend,
                      dtype=self.dtype, eval_routing=self.eval_topk and self.deterministic,
                      sharding=self.sharding, routing_impl=self.routing_impl,
                      with_aux=return_aux_loss or self.aux_loss_coef > 0)
    aux = self.aux_loss_coef * aux
    if return_aux_loss:
      return out, aux
    if self.aux_loss_coef > 0:
      self.sow(nnx.Intermediate, "aux_loss", aux)
    return out


class MoELinen(linen.Module):
  """Linen version of ``MoE`` (same parameters, names and semantics).

  ``deterministic=True`` at call time plays the role of NNX eval mode for ``eval_topk``.
  """

  d_model: int
  d_ff: int
  num_experts: int
  top_k: int
  param_dtype: Dtype = jnp.float32
  dtype: Dtype = jnp.float32
  renormalize: bool = True
  routing: str | TokenRounding = "topk"
  backend: str | ExpertKernels = "auto"
  aux_loss_coef: float = 0.0
  eval_topk: bool = True
  init_std: float = 0.02
  sharding: Any = None  # a sonic_jax.sharding.MoESharding to run on a mesh
  routing_impl: str = "auto"

  @linen.compact
  def __call__(self, x: jax.Array, deterministic: bool = False, return_aux_loss: bool = False):
    _check_config(self.d_model, self.d_ff, self.num_experts, self.top_k, self.routing,
                  self.backend, self.aux_loss_coef, self.sharding, self.routing_impl)
    init = linen.initializers.normal(self.init_std)

    def param(name, shape):
      return self.param(name, linen.with_logical_partitioning(init, LOGICAL_AXES[name]), shape,
                        self.param_dtype)

    router = param("router", (self.d_model, self.num_experts))
    w1 = param("w1", (self.num_experts, self.d_model, 2 * self.d_ff))
    w2 = param("w2", (self.num_experts, self.d_ff, self.d_model))
    out, aux = _apply(x, router, w1, w2, top_k=self.top_k, renormalize=self.renormalize,
                      routing=self.routing, backend=self.backend, dtype=self.dtype,
                      eval_routing=self.eval_topk and deterministic, sharding=self.sharding,
                      routing_impl=self.routing_impl,
                      with_aux=return_aux_loss or self.aux_loss_coef > 0)
    aux = self.aux_loss_coef * aux
    if return_aux_loss:
      return out, aux
    if self.aux_loss_coef > 0:
      self.sow("intermediates", "aux_loss", aux)
    return out
