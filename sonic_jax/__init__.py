"""sonic_jax: SonicMoE-style mixture-of-experts layers for JAX (Pallas Mosaic GPU, CUTLASS FFI)."""

from sonic_jax.backends import (AUTO_ORDER, BACKENDS, COMBINED, BackendUnavailableError,
                                auto_order, available_backends, resolve_backend, select_backend)
from sonic_jax.experts import moe_experts, moe_top_k
from sonic_jax.kernels import ExpertKernels
from sonic_jax.moe import moe
from sonic_jax.routing import (RoutingPlan, TokenRounding, load_balancing_loss,
                               load_balancing_loss_from_mean, route, route_logits, router_logits,
                               wasted_ratio)
from sonic_jax.weights import fuse_gate_up, split_gate_up

__version__ = "0.1.0"

__all__ = [
    "AUTO_ORDER", "BACKENDS", "COMBINED", "BackendUnavailableError", "ExpertKernels", "RoutingPlan",
    "TokenRounding", "auto_order", "available_backends", "fuse_gate_up", "load_balancing_loss",
    "load_balancing_loss_from_mean", "moe",
    "moe_experts", "moe_top_k", "resolve_backend", "route", "route_logits", "router_logits", "select_backend",
    "split_gate_up",
    "wasted_ratio",
]
