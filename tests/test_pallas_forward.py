"""Pallas forward kernels (up_proj, down_proj, combine, dx_pairs) against the xla backend.

CPU tests run the Mosaic GPU kernels in the GPU interpreter at tiny shapes (block_m = 64, two
"SMs"): empty experts, one expert taking every token, groups straddling tiles, E not a power of
two, T·K not a multiple of the tile, fewer pairs than one tile, token-rounding plans with padding
rows. H, A and Y are checked separately (each kernel gets the xla backend's input, so errors do
not compound) with relative Frobenius errors; NaN never passes. ``@pytest.mark.gpu`` tests run
the lowered kernels at real sizes (skipped without a Hopper GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from sonic_jax.pallas import configs
from sonic_jax.pallas.backend import PallasKernels
from sonic_jax.pallas.configs import CombineConfig, ForwardConfig, GemmConfig
from sonic_jax.routing import RoutingPlan, TokenRounding, route_logits
from sonic_jax.xla_backend import XlaKernels
from tests.helpers import rel_err

XLA = XlaKernels()
BF16_TOL = 8e-3  # bf16 outputs round at 2^-9 relative
# One 64-wide k step and one column block per tile keep the interpreter fast; the multi-step
# k pipeline and several column blocks are covered by the warp-specialized and dx tests.
_SMALL = dict(block_m=64, block_k=64, max_concurrent_steps=2, grid_tile_width=2, num_sms=2)
CPU_CFG = ForwardConfig(
    up_proj=GemmConfig(block_n=64, **_SMALL),
    down_proj=GemmConfig(block_n=64, **_SMALL),
    dx_pairs=GemmConfig(block_n=32, **dict(_SMALL, block_k=32)),
    combine=CombineConfig(impl="mosaic", block_d=64, slots=2, num_sms=2))
PALLAS = PallasKernels(interpret=True, config=CPU_CFG)


def topk_plan(num_tokens: int, num_experts: int, top_k: int, *, weights=None,
              first_choice: int | None = None, seed: int = 0) -> RoutingPlan:
  """Top-K plan with distinct experts per token drawn with probabilities ``weights``.

  first_choice: every token's first expert (then one expert takes all tokens).
  """
  rng = np.random.default_rng(seed)
  p = np.ones(num_experts) if weights is None else np.asarray(weights, np.float64)
  experts = np.zeros((num_tokens, top_k), np.int32)
  for t in range(num_tokens):
    if first_choice is None:
      experts[t] = rng.choice(num_experts, top_k, replace=False, p=p / p.sum())
    else:
      q = p.copy()
      q[first_choice] = 0
      experts[t, 0] = first_choice
      experts[t, 1:] = rng.choice(num_experts, top_k - 1, replace=False, p=q / q.sum())
  scores = rng.random((num_tokens, top_k)).astype(np.float32) + 0.1
  scores /= scores.sum(1, keepdims=True)
  return RoutingPlan.from_assignments(
      jnp.repeat(jnp.arange(num_tokens, dtype=jnp.int32), top_k), jnp.asarray(experts.ravel()),
      jnp.asarray(scores.ravel()), num_tokens=num_tokens, num_experts=num_experts, top_k=top_k)


def weights(num_experts: int, d: int, n: int, seed: int = 1, dtype=jnp.bfloat16):
  k1, k2 = jax.random.split(jax.random.key(seed))
  w1 = jax.random.normal(k1, (num_experts, d, 2 * n), jnp.float32) / np.sqrt(d)
  w2 = jax.random.normal(k2, (num_experts, n, d), jnp.float32) / np.sqrt(n)
  return w1.astype(dtype), w2.astype(dtype)


def tokens(num_tokens: int, d: int, seed: int = 2, dtype=jnp.bfloat16):
  return jax.random.normal(jax.random.key(seed), (num_tokens, d), jnp.float32).astype(dtype)


# (name, T, E, K, plan kwargs): every case has groups that straddle 64-row tiles.
CASES = {
    # E = 5 (not a power of two); T·K = 111 is not a multiple of the tile.
    "straddle_e5": (37, 5, 3, {}),
    # Experts 1 and 4 never chosen: empty groups between non-empty ones.
    "empty_experts": (40, 6, 2, dict(weights=[1, 0, 1, 1, 0, 1])),
    # Expert 2 is every token's first choice: one group of T = 70 rows spans two tiles.
    "one_expert_all_tokens": (70, 3, 2, dict(first_choice=2)),
    # Fewer pairs (20) than one tile.
    "fewer_pairs_than_tile": (10, 7, 2, {}),
}


def _case(name):
  t, e, k, kw = CASES[name]
  return topk_plan(t, e, k, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_up_proj_matches_xla(name):
  plan = _case(name)
  d, n = 64, 64
  x = tokens(plan.num_tokens, d)
  w1, _ = weights(plan.num_experts, d, n)
  h, a = jax.jit(PALLAS.up_proj)(x, w1, plan)
  h_ref, a_ref = XLA.up_proj(x, w1, plan)
  if name == "straddle_e5":  # the inference flag writes only A
    h_none, a_inf = PALLAS.up_proj(x, w1, plan, inference=True)
    assert h_none is None and rel_err(a_inf, a_ref) < BF16_TOL
  assert h.shape == h_ref.shape and a.shape == a_ref.shape
  assert h.dtype == jnp.bfloat16 and a.dtype == jnp.bfloat16
  assert rel_err(h, h_ref) < BF16_TOL
  assert rel_err(a, a_ref) < BF16_TOL
  # Against an f64 reference too: the xla backend is not the only judge.
  xg = np.asarray(x, np.float64)[np.asarray(plan.gather_idx)]
  w = np.asarray(w1.astype(jnp.float32), np.float64)
  e_of_row = np.repeat(np.arange(plan.num_experts), np.asarray(plan.group_sizes))
  h64 = np.einsum("pd,pdm->pm", xg, w[e_of_row])
  assert rel_err(h, h64) < BF16_TOL


@pytest.mark.parametrize("name", ["straddle_e5", "empty_experts", "one_expert_all_tokens",
                                  "fewer_pairs_than_tile"])
def test_down_proj_matches_xla(name):
  plan = _case(name)
  d, n = 64, 64
  _, w2 = weights(plan.num_experts, d, n)
  a = tokens(plan.capacity, n, seed=3)
  y = jax.jit(PALLAS.down_proj)(a, w2, plan)
  assert y.shape == (plan.capacity, d) and y.dtype == jnp.bfloat16
  assert rel_err(y, XLA.down_proj(a, w2, plan)) < BF16_TOL


@pytest.mark.parametrize("name", ["straddle_e5", "empty_experts"])
def test_dx_pairs_matches_xla(name):
  plan = _case(name)
  d, n = 64, 32
  w1, _ = weights(plan.num_experts, d, n)
  dh = tokens(plan.capacity, 2 * n, seed=4)
  dx = PALLAS.dx_pairs(dh, w1, plan)
  assert dx.shape == (plan.capacity, d)
  assert rel_err(dx, XLA.dx_pairs(dh, w1, plan)) < BF16_TOL


@pytest.mark.parametrize("weighted", [True, False])
def test_combine_matches_xla(weighted):
  # T = 70: two 64-token blocks, the second shifted back to overlap the first.
  plan = _case("one_expert_all_tokens")
  y = tokens(plan.capacity, 64, seed=5)
  scores = plan.scores if weighted else None
  out = PALLAS.combine(y, plan, scores, jnp.float32)
  ref = XLA.combine(y, plan, scores, jnp.float32)
  assert out.shape == (plan.num_tokens, 64) and out.dtype == jnp.float32
  assert rel_err(out, ref) < 1e-5  # fp32 accumulation of the same bf16 rows


def test_combine_default_xla_impl_matches_xla():
  plan = _case("straddle_e5")
  y = tokens(plan.capacity, 64, seed=8)
  out = PallasKernels(interpret=True).combine(y, plan, plan.scores, jnp.float32)
  assert rel_err(out, XLA.combine(y, plan, plan.scores, jnp.float32)) < 1e-6


def test_combine_fewer_tokens_than_block_bf16_out():
  plan = _case("fewer_pairs_than_tile")
  y = tokens(plan.capacity, 64, seed=6)
  out = PALLAS.combine(y, plan, plan.scores, jnp.bfloat16)
  assert out.dtype == jnp.bfloat16
  assert rel_err(out, XLA.combine(y, plan, plan.scores, jnp.bfloat16)) < BF16_TOL


def test_token_rounding_plan_padding_rows():
  """Capacity > pairs: padding rows are neither needed nor allowed to poison valid rows."""
  logits = jax.random.normal(jax.random.key(7), (40, 5))
  plan = route_logits(logits, top_k=2, routing=TokenRounding(tile=16, mode="up"))
  valid = int(plan.num_pairs)
  assert valid < plan.capacity and plan.top_k is None
  d, n = 64, 64
  x = tokens(plan.num_tokens, d)
  w1, w2 = weights(plan.num_experts, d, n)
  h, a = PALLAS.up_proj(x, w1, plan)
  h_ref, a_ref = XLA.up_proj(x, w1, plan)
  assert rel_err(h[:valid], h_ref[:valid]) < BF16_TOL
  assert rel_err(a[:valid], a_ref[:valid]) < BF16_TOL
  # NaN in the padding rows of A must not reach the valid rows of Y.
  a_nan = a_ref.at[valid:].set(jnp.nan)
  y = PALLAS.down_proj(a_nan, w2, plan)
  assert rel_err(y[:valid], XLA.down_proj(a_ref, w2, plan)[:valid]) < BF16_TOL
  y_ref = XLA.down_proj(a_ref, w2, plan)
  out = PALLAS.combine(y_ref, plan, plan.scores, jnp.float32)
  assert rel_err(out, XLA.combine(y_ref, plan, plan.scores, jnp.float32)) < 1e-5


def _check_up_down(kern, plan, d: int, n: int, down: bool = True) -> None:
  """H and A of kern.up_proj (and Y of down_proj) against the xla backend at bf16 tolerance."""
  x = tokens(plan.num_tokens, d)
  w1, w2 = weights(plan.num_experts, d, n)
  h, a = kern.up_proj(x, w1, plan)
  h_ref, a_ref = XLA.up_proj(x, w1, plan)
  assert rel_err(h, h_ref) < BF16_TOL and rel_err(a, a_ref) < BF16_TOL
  if down:
    assert rel_err(kern.down_proj(a_ref, w2, plan), XLA.down_proj(a_ref, w2, plan)) < BF16_TOL


def _ring_configs(ring: dict, gather: str) -> tuple[GemmConfig, GemmConfig]:
  """(up_proj, plain) configs of the ring kernels from the shared fields ``ring``: up_proj
  with the fused gather, or the cross-tile ring after an XLA gather; down_proj / dx_pairs on
  the cross-tile ring."""
  return (GemmConfig(gather=gather, cross_tile=gather == "xla", **ring),
          GemmConfig(cross_tile=True, **ring))


def _check_forward_gemms(up: GemmConfig, plain: GemmConfig, name: str, d: int, n: int) -> None:
  """up_proj under ``up``, down_proj and dx_pairs under ``plain`` on plan ``name`` in the
  interpreter: H, A, Y and dx against the xla backend at bf16 tolerance."""
  kern = PallasKernels(interpret=True,
                       config=ForwardConfig(up_proj=up, down_proj=plain, dx_pairs=plain))
  plan = _case(name)
  _check_up_down(kern, plan, d, n)
  dh = tokens(plan.capacity, 2 * n, seed=5)
  w1, _ = weights(plan.num_experts, d, n)
  assert rel_err(kern.dx_pairs(dh, w1, plan), XLA.dx_pairs(dh, w1, plan)) < BF16_TOL


# (d, n, block_k): k steps of up_proj / down_proj = (1, 1) (the k == block_k case whose
# producer ran tiles ahead before the end-of-tile barrier), (2, 2), and (4, 2) > 2 slots.
@pytest.mark.parametrize("d,n,block_k", [(64, 64, 64), (64, 64, 32), (128, 64, 32)])
def test_warp_specialized_variant_matches_xla(d, n, block_k):
  """Producer warpgroup + two consumer warpgroups (num_compute_wgs=2), several tiles per CTA."""
  ws = dict(_SMALL, num_compute_wgs=2, block_k=block_k)
  kern = PallasKernels(interpret=True, config=ForwardConfig(
      up_proj=GemmConfig(block_n=32, **ws), down_proj=GemmConfig(block_n=32, **ws)))
  plan = _case("empty_experts")
  _check_up_down(kern, plan, d, n)


@pytest.mark.parametrize("wgs", [1, 2])
def test_swizzled_epilogue_matches_xla(wgs):
  """epilogue_swizzle: full tiles take the swizzled SMEM + one TMA path, ragged tiles the
  ladder. One expert takes every token (a group of 160 rows: two full 64-row tiles), the
  other groups are ragged and straddle tiles; rows outside the groups stay unwritten (NaN)."""
  cfg = GemmConfig(block_n=32, epilogue_swizzle=True, num_compute_wgs=wgs, **_SMALL)
  kern = PallasKernels(interpret=True, config=ForwardConfig(up_proj=cfg, down_proj=cfg))
  plan = topk_plan(160, 3, 2, first_choice=2)
  sizes = np.asarray(plan.group_sizes)
  assert sizes.max() >= 2 * 64 and (sizes % 64 != 0).any()
  d, n = 64, 64
  _check_up_down(kern, plan, d, n)


# (case, wgs, stages, block_k, d): the cp.async gather's ring protocol (publish lag = stages - 2,
# the drain at the end of each CTA) with 1 and 2 k steps per tile, ring shorter and longer than a
# tile, 1 and 2 consumer warpgroups; empty experts, one expert with every token (full tiles), and
# groups straddling tiles.
FUSED_CASES = [
    ("straddle_e5", 1, 3, 64, 64),
    ("straddle_e5", 2, 4, 32, 128),
    ("empty_experts", 2, 3, 64, 64),
    ("one_expert_all_tokens", 1, 5, 32, 128),
    ("one_expert_all_tokens", 2, 2, 64, 64),
]


@pytest.mark.parametrize("name,wgs,stages,block_k,d", FUSED_CASES)
def test_fused_gather_variant_matches_xla(name, wgs, stages, block_k, d):
  """gather='fused': the producer warpgroup gathers x rows into the ring (cp.async on the GPU,
  plain row copies in the interpreter) instead of an XLA gather; H and A against xla."""
  cfg = GemmConfig(block_n=32, gather="fused", num_compute_wgs=wgs,
                   **dict(_SMALL, block_k=block_k, max_concurrent_steps=stages))
  kern = PallasKernels(interpret=True, config=ForwardConfig(up_proj=cfg))
  _check_up_down(kern, _case(name), d, 64 if wgs == 2 else 32, down=False)


@pytest.mark.parametrize("wgs,stages,block_k,d,n", [(1, 3, 64, 64, 64), (2, 4, 32, 128, 128),
                                                    (2, 2, 64, 64, 128)])
def test_cross_tile_ring_matches_xla(wgs, stages, block_k, d, n):
  """cross_tile: up_proj (XLA gather), down_proj and dx_pairs (transposed rhs) through the
  across-tiles ring with the A tile by TMA; empty experts and groups straddling tiles."""
  cfg = GemmConfig(block_n=32, cross_tile=True, num_compute_wgs=wgs,
                   **dict(_SMALL, block_k=block_k, max_concurrent_steps=stages))
  _check_forward_gemms(cfg, cfg, "empty_experts", d, n)


# (case, gather, stages, block_k, d, n): wg_split="m", each consumer warpgroup owns 64 of the
# tile's 128 rows; groups shorter than 64 rows leave one warpgroup's half empty or split across
# the halves, one expert with every token gives full halves (the swizzled store).
SPLIT_M_CASES = [
    ("straddle_e5", "fused", 3, 64, 64, 64),
    ("empty_experts", "fused", 4, 32, 128, 64),
    ("one_expert_all_tokens", "fused", 2, 64, 64, 128),
    ("straddle_e5", "xla", 3, 64, 64, 64),
    ("one_expert_all_tokens", "xla", 4, 32, 128, 64),
]


@pytest.mark.parametrize("name,gather,stages,block_k,d,n", SPLIT_M_CASES)
@pytest.mark.parametrize("swizzle", [False, True])
def test_split_m_ring_matches_xla(name, gather, stages, block_k, d, n, swizzle):
  """GemmConfig(wg_split="m") on the ring kernels: up_proj (fused gather, or the cross-tile
  ring after an XLA gather), down_proj and dx_pairs (cross-tile); H, A, Y, dx against xla."""
  ring = dict(block_m=128, block_n=32, num_compute_wgs=2, wg_split="m", block_k=block_k,
              max_concurrent_steps=stages, epilogue_swizzle=swizzle)
  _check_forward_gemms(*_ring_configs(ring, gather), name, d, n)


@pytest.mark.parametrize("name,gather", [("straddle_e5", "fused"), ("empty_experts", "xla"),
                                         ("one_expert_all_tokens", "fused"),
                                         ("fewer_pairs_than_tile", "xla")])
def test_cluster_pairs_ring_matches_xla(name, gather):
  """GemmConfig(cluster_m=2) on the ring kernels in the interpreter: the cluster grid and the
  pair tiles (each expert's count rounded up to even; the second CTA of an odd pair owns no
  rows), with each CTA loading its whole weight tile (the interpreter has no cluster
  barriers, so no multicast); H, A, Y, dx against xla."""
  ring = dict(block_m=128, block_n=32, num_compute_wgs=2, wg_split="m", block_k=64,
              max_concurrent_steps=3, cluster_m=2)
  _check_forward_gemms(*_ring_configs(ring, gather), name, 64, 64)


# (case, gather, stages, block_k, d, n): wg_split="pingpong", the two consumer warpgroups take
# whole 64-row tiles in turn (k / block_k a multiple of 2 x stages, as the shared ring needs on
# a GPU). The interpreter runs the split rings (it forbids the shared ring's skipped phases):
# item assignment, both rings' waits, releases and drains, the epilogues. Several items per
# CTA (two CTAs), odd and even item counts; one expert with every token gives full tiles (the
# swizzled store), empty experts and straddling groups ragged ones; several k steps and
# column blocks (n / block_n).
PINGPONG_CASES = [
    ("straddle_e5", "fused", 2, 32, 128, 128),
    ("empty_experts", "fused", 4, 32, 256, 256),
    ("one_expert_all_tokens", "fused", 2, 32, 128, 128),
    ("fewer_pairs_than_tile", "fused", 2, 32, 128, 128),
    ("straddle_e5", "xla", 2, 64, 256, 256),
    ("one_expert_all_tokens", "xla", 4, 32, 256, 256),
]


@pytest.mark.parametrize("name,gather,stages,block_k,d,n", PINGPONG_CASES)
@pytest.mark.parametrize("swizzle", [False, True])
def test_pingpong_ring_matches_xla(name, gather, stages, block_k, d, n, swizzle):
  """GemmConfig(wg_split="pingpong") on the ring kernels: up_proj (fused gather, or the
  cross-tile ring after an XLA gather), down_proj and dx_pairs (cross-tile); H, A, Y, dx
  against xla."""
  ring = dict(block_m=64, block_n=32, num_compute_wgs=2, wg_split="pingpong", block_k=block_k,
              max_concurrent_steps=stages, epilogue_swizzle=swizzle, grid_tile_width=2)
  up, plain = _ring_configs(ring, gather)
  assert up.pingpong and up.block_n_cta == 32 and up.block_m_wg == 64
  _check_forward_gemms(up, plain, name, d, n)


@pytest.mark.parametrize("name,gather", [("empty_experts", "fused"), ("straddle_e5", "xla")])
def test_pingpong_split_rings_match_xla(name, gather):
  """pingpong_ring="split" as configured (two rings of max_concurrent_steps // 2 stages, the
  form the interpreter also runs for "shared"), any k (here 96 / 32 = 3 k steps)."""
  ring = dict(block_m=64, block_n=32, num_compute_wgs=2, wg_split="pingpong", block_k=32,
              max_concurrent_steps=4, pingpong_ring="split", grid_tile_width=2)
  _check_forward_gemms(*_ring_configs(ring, gather), name, 96, 96)


def test_pingpong_config_rules():
  ok = dict(num_compute_wgs=2, cross_tile=True, max_concurrent_steps=4, wg_split="pingpong")
  assert GemmConfig(**ok).pingpong and not GemmConfig().pingpong
  for bad in (dict(num_compute_wgs=1), dict(cross_tile=False), dict(cluster_m=2)):
    with pytest.raises(ValueError, match="wg_split='pingpong' needs num_compute_wgs=2"):
      GemmConfig(**{**ok, **bad})
  with pytest.raises(ValueError, match="pingpong_ring must be 'shared' or 'split'"):
    GemmConfig(**ok, pingpong_ring="one")
  with pytest.raises(ValueError, match="pingpong_ring='split' needs max_concurrent_steps >= 4"):
    GemmConfig(**{**ok, "max_concurrent_steps": 3}, pingpong_ring="split")
  assert GemmConfig(**ok).pingpong_ring == "shared"
  cfg = GemmConfig(block_m=64, block_n=128, **ok)
  assert cfg.block_n_cta == 128 and cfg.block_m_wg == 64
  from sonic_jax.pallas.grouped_gemm import smem_bytes, validate_gemm
  # A ring of 4 stages (A 64 x 64, B 64 x 128) and one epilogue tile per warpgroup.
  assert smem_bytes(cfg, epilogue="none") == 4 * (64 * 64 + 64 * 128) * 2 + 2 * 64 * 128 * 2
  # A consumer skips the other's items: k / block_k a multiple of 2 x stages.
  validate_gemm(256, 512, 128, cfg, epilogue="none", what="gemm")
  with pytest.raises(ValueError, match=r"pingpong' needs the contraction's k steps \(768 / "
                     r"block_k = 12\) to be a multiple of 2 x max_concurrent_steps \(8\)"):
    validate_gemm(256, 768, 128, cfg, epilogue="none", what="gemm")
  # The split rings skip nothing: any k.
  validate_gemm(256, 768, 128, GemmConfig(block_m=64, block_n=128, pingpong_ring="split", **ok),
                epilogue="none", what="gemm")
  from sonic_jax.pallas.configs import pingpong_config
  assert pingpong_config(1536, 256, epilogue="swiglu").max_concurrent_steps == 6  # 48 steps
  assert pingpong_config(4096, 1024).max_concurrent_steps == 4  # 128 steps
  assert pingpong_config(256, 1536).max_concurrent_steps == 4  # 8 steps
  assert pingpong_config(128, 1536).max_concurrent_steps == 2  # 4 steps
  with pytest.raises(ValueError, match="pingpong_config: n"):
    pingpong_config(96, 1536)


def test_cluster_config_rules():
  with pytest.raises(ValueError, match="cluster_m must be 1 or 2"):
    GemmConfig(cluster_m=4, cross_tile=True, num_compute_wgs=2)
  with pytest.raises(ValueError, match="cluster_m=2 needs the ring kernel"):
    GemmConfig(cluster_m=2, num_compute_wgs=2)  # no ring
  with pytest.raises(ValueError, match="cluster_m=2 needs the ring kernel"):
    GemmConfig(cluster_m=2, cross_tile=True, num_compute_wgs=1)
  assert GemmConfig(cluster_m=2, gather="fused", num_compute_wgs=2).cluster_m == 2
  assert GemmConfig().cluster_m == 1  # not yet run on a GPU


def test_split_m_config_rules():
  with pytest.raises(ValueError, match="wg_split='m' needs num_compute_wgs=2"):
    GemmConfig(wg_split="m", num_compute_wgs=2, block_m=128)  # no ring kernel
  with pytest.raises(ValueError, match="wg_split='m' needs"):
    GemmConfig(wg_split="m", num_compute_wgs=1, block_m=128, cross_tile=True)
  with pytest.raises(ValueError, match="wg_split must be"):
    GemmConfig(wg_split="k")
  cfg = GemmConfig(wg_split="m", num_compute_wgs=2, block_m=128, block_n=128, cross_tile=True)
  assert cfg.block_n_cta == 128 and cfg.block_m_wg == 64
  from sonic_jax.pallas.grouped_gemm import validate_gemm
  with pytest.raises(ValueError, match=r"multiple of block_n \(wg_split='m'\) \(128"):
    validate_gemm(256, 256, 192, cfg, epilogue="none", what="gemm")
  validate_gemm(256, 256, 128, cfg, epilogue="none", what="gemm")


def test_plain_heuristic_swizzles_the_epilogue_of_short_contractions():
  """The plain ring GEMMs (N % 256 == 0) store through the swizzled epilogue where k <= 2048
  (down_proj at n <= 2048, dx_pairs at 2n <= 2048), and through the untiled one above."""
  for k, n_out, transpose in ((512, 768, False), (1024, 768, True), (2048, 768, True),
                              (2048, 7168, False), (768, 2048, False)):
    cfg = configs.plain_gemm_config(k, n_out, transpose_rhs=transpose)
    assert cfg.cross_tile and cfg.epilogue_swizzle, (k, n_out)
  for k, n_out, transpose in ((4096, 4096, True), (14336, 4096, False), (3072, 2048, False)):
    cfg = configs.plain_gemm_config(k, n_out, transpose_rhs=transpose)
    assert cfg.cross_tile and not cfg.epilogue_swizzle, (k, n_out)
  assert not configs.plain_gemm_config(512, 384).epilogue_swizzle  # N % 256 != 0: no ring


def test_validate_rejects_accumulators_over_the_register_budget():
  from sonic_jax.pallas.grouped_gemm import validate_gemm
  two_accs = GemmConfig(block_m=128, block_n=256, num_compute_wgs=2, wg_split="m",
                        block_k=32, max_concurrent_steps=2, gather="fused")
  with pytest.raises(ValueError, match="256 fp32 accumulator registers per thread"):
    validate_gemm(256, 256, 512, two_accs, epilogue="swiglu", what="up_proj")
  validate_gemm(256, 256, 512, two_accs, epilogue="none", what="down_proj")  # one acc: 128


def test_benchmark_sweep_configs_are_valid():
  """The tilings benchmarks/pallas_forward.py sweeps tile the paper's shapes and fit the SMEM
  and register budgets (a sweep variant that cannot run wastes GPU time)."""
  import importlib.util
  import pathlib
  from sonic_jax.pallas.grouped_gemm import validate_gemm
  path = pathlib.Path(__file__).parents[1] / "benchmarks" / "pallas_forward.py"
  spec = importlib.util.spec_from_file_location("pallas_forward_bench", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  checked = 0
  for t, d, n, e, k, _ in [*bench.PAPER.values(), *bench.PRESETS.values()]:
    down, dx = bench.down_sweep(d, n)
    for _, kern in down:
      validate_gemm(t * k, n, d, kern.config.down_proj, epilogue="none", what="down_proj")
    for _, kern in dx:
      validate_gemm(t * k, 2 * n, d, kern.config.dx_pairs, epilogue="none", what="dx_pairs")
    for _, kern in bench.fused_sweep(d, n):
      validate_gemm(t, d, n, kern.config.up_proj, epilogue="swiglu", what="up_proj")
    checked += len(down) + len(dx)
  assert checked > 0


def test_default_tilings_tile_every_benchmark_shape():
  """PallasKernels' default tilings (forward and backward) pass validation at every paper and
  preset shape, and pick the measured variants: dx_pairs (transposed W1) block_k 64 with rows
  split between the consumers; dW1 / dW2 on the two-consumer ring with either gather."""
  import types
  from sonic_jax import bench
  kern = PallasKernels()
  bf16 = jnp.bfloat16
  for t, d, n, e, k in [c.shape for c in (*bench.PAPER_CONFIGS, *bench.PRESETS)]:
    x = jax.ShapeDtypeStruct((t, d), bf16)
    w1, w2 = jax.ShapeDtypeStruct((e, d, 2 * n), bf16), jax.ShapeDtypeStruct((e, n, d), bf16)
    kern.validate(x, types.SimpleNamespace(capacity=t * k), w1, w2)
    dx = kern._dx_config(2 * n, d)
    if d % 256 == 0 and 2 * n >= 2048:
      assert (dx.block_k, dx.block_n, dx.wg_split, dx.cross_tile) == (64, 256, "m", True)
    dw1, dw2 = kern._dw1_config(d, 2 * n), kern._dw2_config(n, d)
    assert dw1.num_compute_wgs == 2 and dw1.block_n == 256
    assert dw2.num_compute_wgs == 2 and dw2.block_m == 256


def test_validate_rejects_untileable_shapes():
  plan = _case("straddle_e5")
  kern = PallasKernels(interpret=True)
  x = tokens(plan.num_tokens, 64)
  w1, w2 = weights(plan.num_experts, 64, 64)
  kern.validate(x, plan, w1, w2)  # accepted
  x48 = tokens(plan.num_tokens, 48)
  w1_48, w2_48 = weights(plan.num_experts, 48, 64)
  with pytest.raises(ValueError, match=r"x.shape\[1\].*multiple of 32"):
    kern.validate(x48, plan, w1_48, w2_48)
  w1_n, w2_n = weights(plan.num_experts, 64, 40)
  with pytest.raises(ValueError, match=r"w2.shape\[1\].*multiple of 32"):
    kern.validate(x, plan, w1_n, w2_n)
  with pytest.raises(ValueError, match="x must be bfloat16 or float16"):
    kern.validate(x.astype(jnp.float32), plan, w1, w2)
  with pytest.raises(ValueError, match="w1 must have shape"):
    kern.validate(x, plan, w1[:, :, :64], w2)
  big = PallasKernels(interpret=True, config=ForwardConfig(
      down_proj=GemmConfig(block_n=128, num_compute_wgs=2, max_concurrent_steps=2)))
  with pytest.raises(ValueError, match="down_proj.*multiple of block_n"):
    big.validate(x, plan, w1, w2)
  from sonic_jax.pallas.grouped_gemm import validate_gemm
  with pytest.raises(ValueError, match="SMEM"):
    validate_gemm(256, 256, 512, GemmConfig(block_n=256, max_concurrent_steps=8,
                                            num_compute_wgs=2), epilogue="none", what="gemm")


def test_moe_layer_forward_single_k_step_default_config():
  """Regression: (T, d, n, E, K) = (32, 64, 128, 6, 2) with the default heuristic configs
  (up_proj's with block_k = d = 64: the default block_k is now 32).

  up_proj gets the warp-specialized config with d == block_k (one k step): its TMA producer
  waited for no consumer release and ran tiles ahead ("awaiting phase 2, but barrier is already
  at phase 3" in the interpreter; a hang or overwritten operands on the GPU).
  """
  from sonic_jax.moe import moe
  from sonic_jax.pallas import configs
  t, d, n, e, k = 32, 64, 128, 6, 2
  import dataclasses
  up = configs.swiglu_gemm_config(d, n, gather="xla")
  assert up.num_compute_wgs == 2  # the case this test is about, with one k step:
  up = dataclasses.replace(up, block_k=d, max_concurrent_steps=3)
  x = tokens(t, d)
  rw = (jax.random.normal(jax.random.key(12), (d, e)) / 8).astype(jnp.bfloat16)
  w1, w2 = weights(e, d, n)
  out = moe(x, rw, w1, w2, top_k=k,
            backend=PallasKernels(interpret=True, config=ForwardConfig(up_proj=up)))
  ref = moe(x, rw, w1, w2, top_k=k, backend="xla")
  assert out.shape == (t, d) and rel_err(out, ref) < BF16_TOL


def test_moe_layer_forward_through_backend():
  """The public layer with backend=PallasKernels (routing -> up -> down -> combine) vs xla."""
  from sonic_jax.moe import moe
  t, d, n, e, k = 24, 64, 64, 5, 2
  x = tokens(t, d)
  rw = (jax.random.normal(jax.random.key(11), (d, e)) / 8).astype(jnp.bfloat16)
  w1, w2 = weights(e, d, n)
  out = moe(x, rw, w1, w2, top_k=k, backend=PALLAS)
  ref = moe(x, rw, w1, w2, top_k=k, backend="xla")
  assert out.shape == (t, d) and out.dtype == jnp.bfloat16
  assert rel_err(out, ref) < BF16_TOL
  with pytest.raises(ValueError, match=r"x.shape\[1\].*multiple of 32"):
    moe(tokens(t, 48), rw[:48], *weights(e, 48, 64), top_k=k, backend=PALLAS)


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("align,pair", [(8, False), ("block_m", False), (8, True)])
def test_tiles_cover_each_group_row_once(block_m, align, pair):
  """tiles.make_tiles: every row of every group owned by exactly one tile of its expert, load
  rows aligned (8 for the forward GEMMs, block_m for dh), and tile_of_row the inverse map.
  pair: tiles 2i and 2i + 1 belong to one expert, and only a pair's second tile may own no
  rows (an expert with an odd count of windows)."""
  from sonic_jax.pallas.tiles import make_tiles
  align = block_m if align == "block_m" else align
  rng = np.random.default_rng(0)
  for trial, e in enumerate((33, 7, 33, 5)):
    sizes = rng.integers(0, 300, e) * (rng.random(e) < 0.7)
    if trial == 0:
      sizes = np.zeros(e, np.int64)
      sizes[e // 2] = 1000
    total = int(sizes.sum())
    capacity = total + int(rng.integers(0, 50))
    # The forward clamps windows into its (padded) operand; dh lets the last one run past P.
    m_rows = -(-max(capacity, block_m) // align) * align if align == 8 else None
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    go = jnp.asarray(offs)
    t = make_tiles(jnp.asarray(sizes, jnp.int32), go, block_m=block_m, align=align,
                   capacity=capacity, m_rows=m_rows, pair=pair)
    num = int(t.num_tiles)
    assert num <= t.expert.shape[0]
    owner = np.full(total, -1)
    for i in range(num):
      ex, ld, dst, rows = (int(a[i]) for a in (t.expert, t.load, t.dst, t.rows))
      assert ld % align == 0 and 0 <= ld and (m_rows is None or ld <= m_rows - block_m)
      if pair:
        assert num % 2 == 0 and ex == int(t.expert[i ^ 1])
        if rows == 0:
          assert i % 2 == 1 and int(t.rows[i - 1]) > 0
          continue
      assert 1 <= rows and ld <= dst and dst + rows <= ld + block_m
      assert offs[ex] <= dst and dst + rows <= offs[ex + 1]
      assert (owner[dst:dst + rows] == -1).all()
      owner[dst:dst + rows] = i
    assert (owner >= 0).all()
    assert (np.asarray(t.rows[num:]) == 0).all()
    # The row -> expert map given (as dh passes plan.grouped_expert_ids(); padding rows
    # carry expert 0) or searched.
    row_expert = np.concatenate([np.repeat(np.arange(e), sizes), np.zeros(capacity - total)])
    for given in (None, jnp.asarray(row_expert, jnp.int32)):
      tile, within, valid = (np.asarray(v) for v in t.tile_of_row(go, capacity, given))
      assert np.array_equal(valid, np.arange(capacity) < total)
      assert np.array_equal(tile[valid], owner)
      assert np.array_equal(within[valid], np.arange(total) - np.asarray(t.load)[owner])


def test_make_tiles_search_methods_agree(monkeypatch):
  """make_tiles counts tile ends with one compare-all fusion at small E x tiles and a binary
  search above: both give the same metadata (empty experts and one large group included)."""
  from sonic_jax.pallas import tiles as tiles_lib
  sizes = jnp.asarray([0, 130, 0, 0, 1, 700, 0, 64, 129, 0], jnp.int32)
  offs = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(sizes, dtype=jnp.int32)])
  make = lambda: tiles_lib.make_tiles(sizes, offs, block_m=64, align=8, capacity=1100)
  small = make()
  monkeypatch.setattr(tiles_lib, "_COMPARE_ALL_MAX", 0)
  searched = make()
  for a, b in zip(jax.tree.leaves(small), jax.tree.leaves(searched)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# (name, kind, d, n, GemmConfig fields): every grouped-GEMM variant the backend can pick.
LOWERING_VARIANTS = [
    ("up_ws_one_k_step", "up", 64, 128, dict(block_n=64, max_concurrent_steps=3,
                                             num_compute_wgs=2)),
    ("up_ws", "up", 256, 128, dict(block_n=64, max_concurrent_steps=3, num_compute_wgs=2)),
    ("up_single", "up", 128, 64, dict(block_n=64, max_concurrent_steps=4)),
    ("up_single_inference", "up_inference", 128, 64, dict(block_n=64, max_concurrent_steps=4)),
    ("up_fused_gather", "up", 128, 64, dict(block_n=64, max_concurrent_steps=5,
                                            gather="fused")),
    ("up_fused_gather_ws", "up", 256, 128, dict(block_n=64, block_k=32, max_concurrent_steps=6,
                                               num_compute_wgs=2, gather="fused",
                                               epilogue_swizzle=True)),
    ("up_fused_gather_inference", "up_inference", 128, 64, dict(
        block_n=64, max_concurrent_steps=4, gather="fused")),
    ("down_cross_tile", "down", 256, 128, dict(block_n=128, block_k=32, max_concurrent_steps=6,
                                               num_compute_wgs=2, grid_tile_width=16,
                                               cross_tile=True)),
    ("down_cross_tile_swizzled_bk64", "down", 256, 128, dict(
        block_n=128, block_k=64, max_concurrent_steps=3, num_compute_wgs=2,
        epilogue_swizzle=True, cross_tile=True)),
    ("up_fused_gather_split_m", "up", 256, 128, dict(
        block_n=128, block_k=32, max_concurrent_steps=4, num_compute_wgs=2, gather="fused",
        epilogue_swizzle=True, wg_split="m")),
    ("down_cross_tile_split_m", "down", 256, 256, dict(
        block_n=256, block_k=32, max_concurrent_steps=4, num_compute_wgs=2, cross_tile=True,
        epilogue_swizzle=True, wg_split="m")),
    ("dx_pairs_cross_tile_split_m", "dx", 256, 128, dict(
        block_n=256, block_k=32, max_concurrent_steps=4, num_compute_wgs=2, cross_tile=True,
        wg_split="m")),
    ("dx_pairs_cross_tile", "dx", 256, 64, dict(block_n=128, block_k=32, max_concurrent_steps=6,
                                                num_compute_wgs=2, cross_tile=True)),
    ("up_xla_gather_cross_tile", "up", 256, 128, dict(block_n=64, block_k=32,
                                                      max_concurrent_steps=6, num_compute_wgs=2,
                                                      epilogue_swizzle=True, cross_tile=True)),
    ("down_ws", "down", 256, 128, dict(block_n=128, max_concurrent_steps=3,
                                       num_compute_wgs=2)),
    ("down_single_bn64", "down", 64, 64, dict(block_n=64, max_concurrent_steps=5)),
    ("dx_pairs_transposed", "dx", 128, 64, dict(block_n=128, max_concurrent_steps=5)),
    ("up_ws_swizzled_epilogue", "up", 256, 128, dict(block_n=64, block_k=32,
                                                     max_concurrent_steps=6, num_compute_wgs=2,
                                                     epilogue_swizzle=True)),
    ("down_ws_bk32_s6", "down", 256, 128, dict(block_n=128, block_k=32, max_concurrent_steps=6,
                                               num_compute_wgs=2, grid_tile_width=16)),
    ("dx_pairs_ws_bk32_s6", "dx", 256, 64, dict(block_n=128, block_k=32, max_concurrent_steps=6,
                                                 num_compute_wgs=2, grid_tile_width=16)),
    ("up_single_swizzled_epilogue", "up", 128, 64, dict(block_n=64, max_concurrent_steps=4,
                                                        epilogue_swizzle=True)),
    ("down_ws_swizzled_epilogue", "down", 256, 128, dict(block_n=128, max_concurrent_steps=3,
                                                         num_compute_wgs=2,
                                                         epilogue_swizzle=True)),
    ("down_single_swizzled_epilogue", "down", 64, 64, dict(block_n=64, max_concurrent_steps=5,
                                                           epilogue_swizzle=True)),
    # 2-CTA clusters: the weight tile by TMA multicast, slots released through a ClusterBarrier.
    ("up_fused_gather_split_m_cluster2", "up", 256, 128, dict(
        block_n=128, block_k=32, max_concurrent_steps=4, num_compute_wgs=2, gather="fused",
        epilogue_swizzle=True, wg_split="m", cluster_m=2)),
    ("down_cross_tile_split_m_cluster2", "down", 256, 256, dict(
        block_n=256, block_k=32, max_concurrent_steps=4, num_compute_wgs=2, cross_tile=True,
        epilogue_swizzle=True, wg_split="m", cluster_m=2)),
    ("dx_pairs_cross_tile_split_m_bk64_cluster2", "dx", 256, 128, dict(
        block_n=256, block_k=64, max_concurrent_steps=3, num_compute_wgs=2, cross_tile=True,
        wg_split="m", cluster_m=2)),
    ("dx_pairs_cross_tile_cluster2", "dx", 256, 64, dict(
        block_n=128, block_k=32, max_concurrent_steps=6, num_compute_wgs=2, cross_tile=True,
        cluster_m=2)),
    # Ping-pong (session 32): a 64-row tile per warpgroup, two rings side by side.
    ("up_fused_gather_pingpong", "up", 256, 128, dict(
        block_m=64, block_n=128, block_k=32, max_concurrent_steps=4, num_compute_wgs=2,
        gather="fused", epilogue_swizzle=True, wg_split="pingpong")),
    ("up_xla_gather_cross_tile_pingpong", "up", 256, 128, dict(
        block_m=64, block_n=128, block_k=32, max_concurrent_steps=4, num_compute_wgs=2,
        cross_tile=True, epilogue_swizzle=True, wg_split="pingpong")),
    ("down_cross_tile_pingpong", "down", 256, 256, dict(
        block_m=64, block_n=256, block_k=32, max_concurrent_steps=4, num_compute_wgs=2,
        cross_tile=True, epilogue_swizzle=True, wg_split="pingpong")),
    ("dx_pairs_cross_tile_pingpong", "dx", 256, 128, dict(
        block_m=64, block_n=128, block_k=64, max_concurrent_steps=2, num_compute_wgs=2,
        cross_tile=True, wg_split="pingpong")),
    ("up_fused_gather_pingpong_split", "up", 256, 128, dict(
        block_m=64, block_n=128, block_k=32, max_concurrent_steps=6, num_compute_wgs=2,
        gather="fused", epilogue_swizzle=True, wg_split="pingpong", pingpong_ring="split")),
    ("down_cross_tile_pingpong_split", "down", 256, 256, dict(
        block_m=64, block_n=256, block_k=32, max_concurrent_steps=6, num_compute_wgs=2,
        cross_tile=True, epilogue_swizzle=True, wg_split="pingpong", pingpong_ring="split")),
]


@pytest.mark.parametrize("variant", LOWERING_VARIANTS, ids=[v[0] for v in LOWERING_VARIANTS])
def test_forward_kernels_lower_to_mosaic_gpu(variant):
  """Lowers the real (non-interpret) grouped GEMMs for CUDA on the CPU host.

  The interpreter checks no layouts; this runs Mosaic GPU's layout inference and MLIR
  generation for each variant (as test_pallas_backward's test_kernels_lower_to_mosaic_gpu does
  for dh / dw), which reproduces lowering errors such as an unprovable TMA row alignment.
  """
  from sonic_jax.pallas.grouped_gemm import grouped_gemm
  _, kind, d, n, fields = variant
  plan = _case("straddle_e5")
  cfg = GemmConfig(num_sms=132, **fields)
  w1, w2 = weights(plan.num_experts, d, n)
  gs, go, rows = plan.group_sizes, plan.group_offsets, plan.capacity
  if kind.startswith("up"):
    f = lambda x, w: grouped_gemm(x, w, gs, go, num_rows=rows, gather_idx=plan.gather_idx,
                                  epilogue="swiglu", inference=kind == "up_inference",
                                  config=cfg)
    args = (tokens(plan.num_tokens, d), w1)
  elif kind == "down":
    f = lambda a, w: grouped_gemm(a, w, gs, go, num_rows=rows, config=cfg)
    args = (tokens(rows, n), w2)
  else:
    f = lambda dh, w: grouped_gemm(dh, w, gs, go, num_rows=rows, transpose_rhs=True, config=cfg)
    args = (tokens(rows, 2 * n), w1)
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def test_swiglu_heuristic_fuses_the_gather_where_measured():
  from sonic_jax.pallas import configs
  fused = configs.swiglu_gemm_config(4096, 512)
  assert fused.gather == "fused" and fused.num_compute_wgs == 2 and fused.grid_tile_width == 16
  assert configs.swiglu_gemm_config(1024, 192).gather == "xla"  # n % 128 != 0: untimed
  assert configs.swiglu_gemm_config(4096, 512, gather="xla").gather == "xla"
  from sonic_jax.pallas import cp_async
  with pytest.raises(ValueError, match="block_k"):
    cp_async.swizzle_bytes(24, 2)  # 48-byte rows: no swizzle mode fits


def test_config_rejects_bad_fields():
  with pytest.raises(ValueError, match="block_m"):
    GemmConfig(block_m=96)
  with pytest.raises(ValueError, match="gather"):
    GemmConfig(gather="tma")
  with pytest.raises(ValueError, match="block_d"):
    CombineConfig(block_d=300)
  with pytest.raises(ValueError, match="impl"):
    CombineConfig(impl="triton")


# ------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [  # (T, d, n, E, K): a fine-grained and a coarse config, E not a power of two;
    # n = 192 takes the single-consumer tilings (the fused gather's included)
    (4096, 1536, 256, 72, 8),
    (4096, 1024, 1024, 24, 2),
    (2048, 512, 192, 10, 4),
    # n = 2048: dx_pairs' contraction 2n >= 4096 takes the row-split ring (wg_split="m")
    (2048, 512, 2048, 6, 2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES[:2])
def test_gpu_cross_tile_matches_xla(shape):
  """GemmConfig(cross_tile=True) for down_proj and dx_pairs (the across-tiles ring, A by TMA)."""
  import dataclasses
  from sonic_jax.pallas import configs
  t, d, n, e, k = shape
  plan = route_logits(jax.random.normal(jax.random.key(0), (t, e)), top_k=k)
  down = dataclasses.replace(configs.plain_gemm_config(n, d), cross_tile=True,
                             num_compute_wgs=2)
  dx = dataclasses.replace(configs.plain_gemm_config(2 * n, d), cross_tile=True,
                           num_compute_wgs=2)
  kern = PallasKernels(config=ForwardConfig(down_proj=down, dx_pairs=dx))
  w1, w2 = weights(e, d, n)
  a = tokens(plan.capacity, n, seed=3)
  y, y_ref = jax.jit(kern.down_proj)(a, w2, plan), jax.jit(XLA.down_proj)(a, w2, plan)
  assert rel_err(y, y_ref) < BF16_TOL
  dh = tokens(plan.capacity, 2 * n, seed=4)
  assert rel_err(jax.jit(kern.dx_pairs)(dh, w1, plan),
                 jax.jit(XLA.dx_pairs)(dh, w1, plan)) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [GPU_SHAPES[0], GPU_SHAPES[1], GPU_SHAPES[3]])
def test_gpu_cluster_pairs_match_xla(shape):
  """GemmConfig(cluster_m=2) on the heuristic's ring configs (up_proj with the fused gather,
  down_proj, dx_pairs): the weight tiles by TMA multicast over 2-CTA clusters."""
  import dataclasses
  t, d, n, e, k = shape
  plan = route_logits(jax.random.normal(jax.random.key(0), (t, e)), top_k=k)
  c2 = lambda cfg: dataclasses.replace(cfg, cluster_m=2)
  kern = PallasKernels(config=ForwardConfig(
      up_proj=c2(configs.swiglu_gemm_config(d, n, gather="fused")),
      down_proj=c2(configs.plain_gemm_config(n, d)),
      dx_pairs=c2(configs.plain_gemm_config(2 * n, d, transpose_rhs=True))))
  x, (w1, w2) = tokens(t, d), weights(e, d, n)
  kern.validate(x, plan, w1, w2)
  h, a = jax.jit(kern.up_proj)(x, w1, plan)
  h_ref, a_ref = jax.jit(XLA.up_proj)(x, w1, plan)
  assert rel_err(h, h_ref) < BF16_TOL and rel_err(a, a_ref) < BF16_TOL
  y, y_ref = jax.jit(kern.down_proj)(a_ref, w2, plan), jax.jit(XLA.down_proj)(a_ref, w2, plan)
  assert rel_err(y, y_ref) < BF16_TOL
  assert rel_err(jax.jit(kern.dx_pairs)(h_ref, w1, plan),
                 jax.jit(XLA.dx_pairs)(h_ref, w1, plan)) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [GPU_SHAPES[0], GPU_SHAPES[1], GPU_SHAPES[3]])
def test_gpu_pingpong_matches_xla(shape):
  """GemmConfig(wg_split="pingpong") on the ring kernels at real sizes: up_proj with the fused
  gather (64 x 128 (x2) per warpgroup), down_proj and dx_pairs (64 x 256)."""
  from sonic_jax.pallas import configs
  t, d, n, e, k = shape
  plan = route_logits(jax.random.normal(jax.random.key(0), (t, e)), top_k=k)
  kern = PallasKernels(config=ForwardConfig(
      up_proj=configs.pingpong_config(d, n, epilogue="swiglu"),
      down_proj=configs.pingpong_config(n, d),
      dx_pairs=configs.pingpong_config(2 * n, d)))
  x, (w1, w2) = tokens(t, d), weights(e, d, n)
  kern.validate(x, plan, w1, w2)
  h, a = jax.jit(kern.up_proj)(x, w1, plan)
  h_ref, a_ref = jax.jit(XLA.up_proj)(x, w1, plan)
  assert rel_err(h, h_ref) < BF16_TOL and rel_err(a, a_ref) < BF16_TOL
  y, y_ref = jax.jit(kern.down_proj)(a_ref, w2, plan), jax.jit(XLA.down_proj)(a_ref, w2, plan)
  assert rel_err(y, y_ref) < BF16_TOL
  assert rel_err(jax.jit(kern.dx_pairs)(h_ref, w1, plan),
                 jax.jit(XLA.dx_pairs)(h_ref, w1, plan)) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("gather", ["xla", "fused"])
def test_gpu_forward_matches_xla(shape, gather):
  t, d, n, e, k = shape
  logits = jax.random.normal(jax.random.key(0), (t, e))
  plan = route_logits(logits, top_k=k)
  x = tokens(t, d)
  w1, w2 = weights(e, d, n)
  from sonic_jax.pallas import configs
  kern = PallasKernels(config=ForwardConfig(up_proj=configs.swiglu_gemm_config(d, n,
                                                                               gather=gather)))
  kern.validate(x, plan, w1, w2)
  h, a = jax.jit(kern.up_proj)(x, w1, plan)
  h_ref, a_ref = jax.jit(XLA.up_proj)(x, w1, plan)
  assert rel_err(h, h_ref) < BF16_TOL and rel_err(a, a_ref) < BF16_TOL
  y = jax.jit(kern.down_proj)(a_ref, w2, plan)
  y_ref = jax.jit(XLA.down_proj)(a_ref, w2, plan)
  assert rel_err(y, y_ref) < BF16_TOL
  for impl in ("xla", "mosaic"):
    kc = PallasKernels(config=ForwardConfig(combine=configs.combine_config(d, impl)))
    out = jax.jit(kc.combine, static_argnums=3)(y_ref, plan, plan.scores, jnp.float32)
    assert rel_err(out, XLA.combine(y_ref, plan, plan.scores, jnp.float32)) < 1e-5
  dh = h_ref
  assert rel_err(jax.jit(kern.dx_pairs)(dh, w1, plan), jax.jit(XLA.dx_pairs)(dh, w1, plan)) < BF16_TOL
