"""Inputs and the timed layer functions shared by every implementation.

Inputs follow the paper's benchmark (bf16; x and dO = 0.2·randn, expert weights N(0, 0.02)). The
router weights are scaled so the logits are ~N(0, 1). Skewed routing adds a fixed Zipf-like bias
to the logits, b_e = -s·log(1 + e): expert e is then chosen with a prior ∝ (1 + e)^-s, so
expert 0 is the hottest and the load falls off as a power law. The bias is deterministic (no
randomness), the same for every implementation, and part of the timed router.

Every implementation is a function ``layer(x, router_w, w1, w2) -> out (T, d)`` that includes
the router GEMM, softmax/top-K (or token rounding), routing metadata, the expert block and the
combine, like the paper's timed forward.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.routing import RoutingPlan, TokenRounding, route
from sonic_jax.bench.configs import BenchConfig

RoutingDist = Literal["uniform", "zipf"]
Layer = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class RoutingSpec:
  """How tokens are routed: ``method`` topk or tr (token rounding), ``dist`` uniform or zipf,
  ``route_impl`` the top-K routing implementation (default "auto", as the layer's default)."""

  method: str = "topk"
  dist: RoutingDist = "uniform"
  zipf_s: float = 1.2
  tile: int = 128
  rounding_mode: str = "nearest"
  route_impl: str = "auto"  # who routes top-K: as sonic_jax.moe(routing_impl=...)

  def __post_init__(self):
    from sonic_jax.triton import validate_route_impl
    validate_route_impl(self.route_impl, "route_impl")
    if self.method not in ("topk", "tr"):
      raise ValueError(f"routing method must be 'topk' or 'tr', got {self.method!r}")
    if self.dist not in ("uniform", "zipf"):
      raise ValueError(f"routing dist must be 'uniform' or 'zipf', got {self.dist!r}")
    if not self.zipf_s > 0:
      raise ValueError(f"zipf_s must be > 0, got {self.zipf_s!r}")

  @property
  def routing(self) -> str | TokenRounding:
    if self.method == "tr":
      return TokenRounding(tile=self.tile, mode=self.rounding_mode)
    return "topk"

  @property
  def label(self) -> str:
    r = "topk" if self.method == "topk" else f"tr{self.tile}-{self.rounding_mode}"
    return r + ("" if self.dist == "uniform" else f"-zipf{self.zipf_s:g}")

  def logit_bias(self, num_experts: int) -> np.ndarray | None:
    if self.dist == "uniform":
      return None
    return (-self.zipf_s * np.log1p(np.arange(num_experts))).astype(np.float32)


@dataclasses.dataclass
class Problem:
  cfg: BenchConfig
  x: jax.Array        # (T, d)
  router_w: jax.Array  # (d, E)
  w1: jax.Array       # (E, d, 2n)
  w2: jax.Array       # (E, n, d)
  dout: jax.Array     # (T, d)

  @property
  def args(self) -> tuple[jax.Array, ...]:
    return (self.x, self.router_w, self.w1, self.w2)


def make_problem(cfg: BenchConfig, seed: int = 0, dtype=jnp.bfloat16) -> Problem:
  """Random inputs for ``cfg`` on the default device (never zeros)."""
  kx, kr, k1, k2, kd = jax.random.split(jax.random.key(seed), 5)
  T, d, n, E = cfg.T, cfg.d, cfg.n, cfg.E

  def normal(key, shape, scale):
    # Drawn in the target dtype: an fp32 draw of the largest presets' weights would need 30 GB.
    return (jax.random.normal(key, shape, dtype) * jnp.asarray(scale, dtype)).astype(dtype)

  @jax.jit
  def gen():
    return (normal(kx, (T, d), 0.2), normal(kr, (d, E), 1 / (0.2 * np.sqrt(d))),
            normal(k1, (E, d, 2 * n), 0.02), normal(k2, (E, n, d), 0.02),
            normal(kd, (T, d), 0.2))

  return Problem(cfg, *gen())


def plan_fn(cfg: BenchConfig, spec: RoutingSpec) -> Callable[[jax.Array, jax.Array], RoutingPlan]:
  """(x, router_w) -> RoutingPlan with the spec's routing and logit bias (jittable)."""
  bias = spec.logit_bias(cfg.E)

  def make_plan(x, router_w):
    return route(x, router_w, top_k=cfg.K, routing=spec.routing, impl=spec.route_impl,
                 logit_bias=None if bias is None else jnp.asarray(bias))

  return make_plan


def routing_stats(problem: Problem, spec: RoutingSpec) -> dict:
  """Kept pairs and load imbalance (max / mean expert load) of the problem's routing."""
  plan = jax.jit(plan_fn(problem.cfg, spec))(problem.x, problem.router_w)
  sizes = np.asarray(jax.device_get(plan.group_sizes))
  pairs = int(sizes.sum())
  mean = pairs / len(sizes)
  return {"pairs": pairs, "max_load": int(sizes.max()), "min_load": int(sizes.min()),
          "imbalance": float(sizes.max() / mean) if mean else 0.0,
          "empty_experts": int((sizes == 0).sum())}


def sonic_layer(kernels, cfg: BenchConfig, spec: RoutingSpec) -> Layer:
  """The sonic_jax layer on ``kernels`` (a backend name or ExpertKernels instance)."""
  from sonic_jax.experts import moe_experts
  make_plan = plan_fn(cfg, spec)

  def layer(x, router_w, w1, w2):
    return moe_experts(x, make_plan(x, router_w), w1, w2, backend=kernels)

  return layer
