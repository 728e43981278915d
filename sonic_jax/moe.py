"""``sonic_jax.moe``: router + routing + expert block in one call."""

from __future__ import annotations

import jax
import numpy as np

from sonic_jax.backends import validate_backend_name
from sonic_jax.experts import moe_experts, moe_top_k, validate_expert_args
from sonic_jax.kernels import ExpertKernels
from sonic_jax.routing import (TokenRounding, route, validate_router_args,
                               validate_routing_args)
from sonic_jax.triton import validate_route_impl  # imports without jax-triton


def moe(x: jax.Array, router_w: jax.Array, w1: jax.Array, w2: jax.Array, *, top_k: int,
        renormalize: bool = True, routing: str | TokenRounding = "topk",
        backend: str | ExpertKernels = "auto", routing_impl: str = "auto") -> jax.Array:
  """SwiGLU mixture-of-experts layer.

  Args:
    x: (T, d) tokens (bf16 or f32).
    router_w: (d, E) router weights; logits = x · router_w, softmax over experts in fp32.
    w1: (E, d, 2n) gate | up projections (see ``fuse_gate_up``); w2: (E, n, d).
    top_k: experts per token, 1 <= top_k <= E.
    renormalize: scores are the top-K softmax probabilities divided by their sum (Mixtral /
      SonicMoE default); False keeps the raw probabilities (OLMoE / Qwen3 style).
    routing: "topk", "token_rounding" (tile 128, nearest) or a ``TokenRounding`` config.
    backend: "auto" | "xla" | "pallas" | "ffi" | "pallas+ffi" | "pallas+ffi-wgrad"
      (``sonic_jax.COMBINED``: the pallas forward with the ffi backward GEMMs; pallas' forward
      and dh with ffi's dx_pairs and gathered weight gradients), or an ExpertKernels instance.
      "auto": the fastest available backend for this shape that accepts it
      (``sonic_jax.select_backend``).
    routing_impl: who computes top-K routing and the plan: "auto" (default: the fastest
      measured that runs here, see docs/triton.md; "xla" on CPUs), "xla", "pallas_triton" or
      "jax_triton" (needs the ``triton`` extra). Every choice gives the same plan; token
      rounding always routes with "xla".
  Returns:
    (T, d) in x.dtype: out_t = Σ_k s_tk · (silu(x_t W1g_e) ⊙ x_t W1u_e) · W2_e.
  """
  validate_router_args(x, router_w)
  validate_backend_name(backend)
  validate_route_impl(routing_impl, "routing_impl")
  if getattr(w1, "ndim", None) == 3 and router_w.shape[1] != w1.shape[0]:
    raise ValueError(
        f"router_w has {router_w.shape[1]} experts but w1 has {w1.shape[0]} (w1.shape[0] must "
        f"equal router_w.shape[1])")
  if routing == "topk":  # one custom_vjp for the router's and the experts' backward
    validate_routing_args(np.zeros((1, router_w.shape[1]), np.float32), top_k, routing)
    return moe_top_k(x, router_w, w1, w2, top_k=top_k, renormalize=renormalize,
                     backend=backend, routing_impl=routing_impl)[0]
  plan = route(x, router_w, top_k=top_k, renormalize=renormalize, routing=routing,
               impl=routing_impl)
  validate_expert_args(x, plan, w1, w2)
  return moe_experts(x, plan, w1, w2, backend=backend)
