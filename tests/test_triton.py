"""sonic_jax.triton: top-K, routing metadata, combine and dispatch kernels against the xla path.

CPU: the Pallas-Triton kernels in interpret mode (tiny shapes) and every wrapper's validation.
GPU (marked): both implementations (jax-triton needs the `triton` extra) at realistic sizes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sonic_jax import routing
from sonic_jax import triton as tri
from sonic_jax.routing import RoutingPlan, TokenRounding
from sonic_jax.xla_backend import XlaKernels
from tests.helpers import gpu_triton_impls, rel_err

_PLAN_FIELDS = ("group_sizes", "group_offsets", "gather_idx", "scatter_idx", "reverse_idx",
                "token_ids", "expert_ids", "token_offsets")
_SMALL = tri.MetadataConfig(chunk=16, chunks_per_block=2)  # several chunks and blocks


def _logits(t, e, seed=0, skew="none"):
  x = jax.random.normal(jax.random.key(seed), (t, e), jnp.float32)
  if skew == "one":  # everybody's first choice is expert 0
    x = x.at[:, 0].add(20.0)
  elif skew == "empty":  # experts 1 and e-1 are never chosen
    x = x.at[:, 1].set(-30.0).at[:, e - 1].set(-30.0)
  return x


def _assert_same_plan(plan: RoutingPlan, ref: RoutingPlan, *, scores_tol=1e-6):
  for f in _PLAN_FIELDS:
    a, b = np.asarray(getattr(plan, f)), np.asarray(getattr(ref, f))
    assert a.dtype == b.dtype and a.shape == b.shape, f
    np.testing.assert_array_equal(a, b, err_msg=f)
  assert (plan.num_tokens, plan.num_experts, plan.top_k) == (
      ref.num_tokens, ref.num_experts, ref.top_k)
  assert rel_err(plan.scores, ref.scores) <= scores_tol


def _flat_assignments(t, e, k, seed, skew):
  """Top-K expert ids (T*K,) from the xla path, for metadata-only comparisons."""
  probs = jax.nn.softmax(_logits(t, e, seed, skew), axis=-1)
  top_p, top_e = jax.lax.top_k(probs, k)
  tokens = jnp.repeat(jnp.arange(t, dtype=jnp.int32), k)
  return tokens, top_e.reshape(-1), top_p.reshape(-1)


# ------------------------------------------------------------------------- CPU: interpret
@pytest.mark.parametrize("t,e,k,skew", [(37, 12, 3, "none"), (20, 6, 6, "none"),
                                        (33, 10, 2, "one")])
def test_topk_softmax_interpret(t, e, k, skew):
  logits = _logits(t, e, seed=1, skew=skew)
  probs, experts = tri.topk_softmax(logits, k, impl="pallas_triton", interpret=True,
                                    config=tri.TopKConfig(block_t=8))
  ref_p, ref_e = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
  np.testing.assert_array_equal(np.asarray(experts), np.asarray(ref_e))
  assert rel_err(probs, ref_p) < 1e-6


def test_topk_softmax_ties_go_to_the_lower_expert_interpret():
  # Integer logits: many exact ties, as lax.top_k breaks them (lower index first); -inf logits
  # are still selectable once each.
  logits = jax.random.randint(jax.random.key(2), (16, 10), -2, 3).astype(jnp.float32)
  logits = logits.at[3, :].set(-jnp.inf).at[3, 4].set(0.0)
  probs, experts = tri.topk_softmax(logits, 4, impl="pallas_triton", interpret=True)
  ref_p, ref_e = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), 4)
  np.testing.assert_array_equal(np.asarray(experts), np.asarray(ref_e))
  assert np.all(np.asarray(experts[3]) == [4, 0, 1, 2])
  assert rel_err(probs, ref_p) < 1e-6


def test_topk_softmax_gradient_interpret():
  logits = _logits(24, 12, seed=3)
  w = jax.random.normal(jax.random.key(4), (24, 3))

  def loss(fn, l):
    p, _ = fn(l)
    return jnp.sum(w * p / jnp.sum(p, axis=-1, keepdims=True))

  ours = jax.grad(lambda l: loss(
      lambda x: tri.topk_softmax(x, 3, impl="pallas_triton", interpret=True), l))(logits)
  ref = jax.grad(lambda l: loss(
      lambda x: jax.lax.top_k(jax.nn.softmax(x, axis=-1), 3), l))(logits)
  assert rel_err(ours, ref) < 1e-5


@pytest.mark.parametrize("t,e,k,skew", [
    (37, 12, 3, "none"),   # E not a power of two, groups straddle chunks and blocks
    (40, 8, 2, "one"),     # all tokens' first choice on one expert
    (29, 7, 2, "empty"),   # empty experts
    (5, 16, 1, "none"),    # fewer pairs than one chunk
])
def test_metadata_exact_interpret(t, e, k, skew):
  tokens, experts, scores = _flat_assignments(t, e, k, seed=5, skew=skew)
  ref = RoutingPlan.from_assignments(tokens, experts, scores, num_tokens=t, num_experts=e,
                                     top_k=k)
  plan = tri.plan_from_assignments(tokens, experts, scores, num_tokens=t, num_experts=e,
                                   top_k=k, impl="pallas_triton", config=_SMALL,
                                   interpret=True)
  _assert_same_plan(plan, ref, scores_tol=0.0)
  if skew == "empty":
    assert int(plan.group_sizes[1]) == 0 and int(plan.group_sizes[e - 1]) == 0


def test_metadata_token_rounding_plan_interpret():
  # Variable pairs per token and padding rows (valid is a prefix): rebuild the xla token
  # rounding plan from its own flat assignments.
  t, e, k = 40, 6, 2
  ref = routing.route_logits(_logits(t, e, seed=6), top_k=k,
                             routing=TokenRounding(tile=8, mode="down"))
  valid = ref.valid_mask()
  assert int(ref.num_pairs) < ref.capacity  # there is padding to place
  plan = tri.plan_from_assignments(ref.token_ids, ref.expert_ids, ref.scores, num_tokens=t,
                                   num_experts=e, valid=valid, impl="pallas_triton",
                                   config=_SMALL, interpret=True)
  _assert_same_plan(plan, ref, scores_tol=1e-12)


def test_routing_metadata_num_valid_default_config_interpret():
  # Direct call with a traced valid count and the default config (chunk 32): pairs past
  # num_valid keep p = j and token 0, as from_assignments places padding.
  t, e, cap, nv = 30, 5, 70, 41
  key = jax.random.key(13)
  tokens = jnp.sort(jax.random.randint(key, (cap,), 0, t)).astype(jnp.int32)
  experts = jax.random.randint(jax.random.fold_in(key, 1), (cap,), 0, e).astype(jnp.int32)
  valid = jnp.arange(cap) < nv
  ref = RoutingPlan.from_assignments(tokens, experts, jnp.ones((cap,)), num_tokens=t,
                                     num_experts=e, valid=valid)
  got = tri.routing_metadata(jnp.where(valid, experts, 0), num_experts=e,
                             token_ids=jnp.where(valid, tokens, 0), num_valid=jnp.int32(nv),
                             impl="pallas_triton", interpret=True)
  for name, a in zip(("group_sizes", "group_offsets", "gather_idx", "scatter_idx",
                      "reverse_idx"), got):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(getattr(ref, name)), err_msg=name)
  np.testing.assert_array_equal(np.asarray(got[4][nv:]), np.arange(nv, cap))


def test_route_logits_interpret_matches_xla():
  t, e, k = 45, 12, 4
  logits = _logits(t, e, seed=7)
  plan = tri.route_logits(logits, top_k=k, impl="pallas_triton", config=_SMALL, interpret=True)
  _assert_same_plan(plan, routing.route_logits(logits, top_k=k), scores_tol=1e-6)
  raw = tri.route_logits(logits, top_k=k, renormalize=False, impl="pallas_triton",
                         topk_impl="xla", config=_SMALL, interpret=True)
  _assert_same_plan(raw, routing.route_logits(logits, top_k=k, renormalize=False))


def test_route_logits_under_vmap_interpret():
  """Every kernel launch is a sequential_vmap: vmap runs the kernels once per batch element and
  gives each element's own plan (and the top-K gradient still flows)."""
  t, e, k, b = 21, 6, 2, 3
  logits = jnp.stack([_logits(t, e, seed=30 + i) for i in range(b)])
  plans = jax.vmap(lambda l: tri.route_logits(l, top_k=k, impl="pallas_triton", config=_SMALL,
                                              interpret=True))(logits)
  for i in range(b):
    ref = routing.route_logits(logits[i], top_k=k)
    for f in ("group_sizes", "gather_idx", "reverse_idx", "expert_ids"):
      np.testing.assert_array_equal(np.asarray(getattr(plans, f)[i]),
                                    np.asarray(getattr(ref, f)), err_msg=f"{f} [{i}]")
  y = jax.random.normal(jax.random.key(3), (b, t * k, 16), jnp.float32)

  def loss(l, impl):
    def one(li, yi):
      plan = (tri.route_logits(li, top_k=k, impl=impl, config=_SMALL, interpret=True)
              if impl else routing.route_logits(li, top_k=k))
      return XlaKernels().combine(yi, plan, plan.scores, jnp.float32)
    return jnp.sum(jax.vmap(one)(l, y) ** 2)

  g = jax.grad(loss)(logits, "pallas_triton")
  g_ref = jax.grad(loss)(logits, None)
  assert rel_err(g, g_ref) < 1e-5
  with pytest.raises(AssertionError):  # the grouped rows differ per element: a loop, not a broadcast
    np.testing.assert_array_equal(np.asarray(plans.gather_idx[0]), np.asarray(plans.gather_idx[1]))


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("t,e,k,d", [(19, 6, 3, 64), (8, 5, 1, 48)])
def test_combine_interpret(weighted, t, e, k, d):
  plan = routing.route_logits(_logits(t, e, seed=8), top_k=k)
  y = (jax.random.normal(jax.random.key(9), (plan.capacity, d)) * 2).astype(jnp.bfloat16)
  scores = plan.scores if weighted else None
  out = tri.combine(y, plan, scores, jnp.bfloat16, impl="pallas_triton", interpret=True,
                    config=tri.CombineConfig(block_t=4, block_d=16))
  ref = XlaKernels().combine(y, plan, scores, jnp.bfloat16)
  assert out.shape == (t, d) and out.dtype == jnp.bfloat16
  assert rel_err(out, ref) < 1e-2
  out32 = tri.combine(y, plan, scores, jnp.float32, impl="pallas_triton", interpret=True,
                      config=tri.CombineConfig(block_t=4, block_d=16))
  assert rel_err(out32, XlaKernels().combine(y, plan, scores, jnp.float32)) < 1e-6


def test_combine_token_rounding_plan_uses_segment_sum():
  plan = routing.route_logits(_logits(30, 6, seed=10), top_k=2,
                              routing=TokenRounding(tile=4, mode="up"))
  y = jax.random.normal(jax.random.key(11), (plan.capacity, 32), jnp.float32)
  out = tri.combine(y, plan, plan.scores, jnp.float32, impl="pallas_triton", interpret=True)
  assert rel_err(out, XlaKernels().combine(y, plan, plan.scores, jnp.float32)) < 1e-6


@pytest.mark.parametrize("method", ["scatter", "gather"])
@pytest.mark.parametrize("t,e,k,d,skew", [(19, 6, 3, 64, "none"), (8, 5, 1, 48, "none"),
                                          (21, 7, 2, 32, "one"), (16, 9, 4, 16, "empty")])
def test_dispatch_interpret(method, t, e, k, d, skew):
  """The grouped rows x[gather_idx] bit for bit: T not a multiple of block_t, K = 1, every
  token's first choice one expert, empty experts."""
  plan = routing.route_logits(_logits(t, e, seed=13, skew=skew), top_k=k)
  x = jax.random.normal(jax.random.key(14), (t, d)).astype(jnp.bfloat16)
  out = tri.dispatch(x, plan, impl="pallas_triton", interpret=True,
                     config=tri.DispatchConfig(method=method, block_t=4, block_d=16))
  assert out.shape == (t * k, d) and out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(x[plan.gather_idx], np.float32))


def test_dispatch_token_rounding_plan_gathers():
  """A plan without a fixed K (token rounding, padding rows) takes the gather path even when
  the scatter is asked for; padding rows get x[0], as XLA's gather gives them."""
  plan = routing.route_logits(_logits(30, 6, seed=15), top_k=2,
                              routing=TokenRounding(tile=4, mode="up"))
  assert plan.top_k is None and plan.capacity > 60
  x = jax.random.normal(jax.random.key(16), (30, 32), jnp.float32)
  out = tri.dispatch(x, plan, impl="pallas_triton", interpret=True,
                     config=tri.DispatchConfig(block_t=8, block_d=32))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x[plan.gather_idx]))


def test_dispatch_validation():
  plan = routing.route_logits(_logits(8, 4, seed=17), top_k=2)
  x = jnp.zeros((8, 24), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"x must have shape \(T, d\) with T = plan.num_tokens"):
    tri.dispatch(x[:7], plan, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="x must be floating point"):
    tri.dispatch(x.astype(jnp.int32), plan, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="must be a multiple of DispatchConfig.block_d"):
    tri.dispatch(x, plan, impl="pallas_triton", interpret=True,
                 config=tri.DispatchConfig(block_d=16))
  with pytest.raises(ValueError, match="must be a multiple of 8"):
    tri.dispatch(jnp.zeros((8, 12), jnp.bfloat16), plan, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="DispatchConfig.method must be"):
    tri.DispatchConfig(method="all-to-all")
  with pytest.raises(ValueError, match="DispatchConfig.block_t must be a power of two"):
    tri.DispatchConfig(block_t=3)
  with pytest.raises(ValueError, match="impl must be one of"):
    tri.dispatch(x, plan, impl="cuda")
  with pytest.raises(ValueError, match="interpret=True needs impl='pallas_triton'"):
    tri.dispatch(x, plan, impl="jax_triton", interpret=True)


# ------------------------------------------------------------------- CPU: hook, validation
def test_route_logits_hook():
  logits = _logits(12, 6, seed=12)
  ref = routing.route_logits(logits, top_k=2)
  _assert_same_plan(routing.route_logits(logits, top_k=2, impl="auto"), ref, scores_tol=0)
  with pytest.raises(ValueError, match="impl must be one of"):
    routing.route_logits(logits, top_k=2, impl="cuda")
  if tri.jax_triton_unavailable_reason() is not None:
    with pytest.raises(RuntimeError, match="impl='jax_triton' is not available"):
      routing.route_logits(logits, top_k=2, impl="jax_triton")
  # Token rounding: the selection in the Pallas-Triton radix-select kernel (interpret mode),
  # the same plan bit for bit, gradients through the scores.
  tr = TokenRounding(tile=4)
  _assert_same_plan(routing.route_logits(logits, top_k=2, routing=tr, impl="pallas_triton",
                                         interpret=True),
                    routing.route_logits(logits, top_k=2, routing=tr), scores_tol=0)
  grad = lambda impl: jax.grad(lambda lg: jnp.sum(routing.route_logits(
      lg, top_k=2, routing=tr, impl=impl, interpret=True).scores ** 2))(logits)
  np.testing.assert_array_equal(grad("pallas_triton"), grad("xla"))
  if jax.devices()[0].platform != "gpu":
    with pytest.raises(RuntimeError, match="pallas_triton"):
      routing.route_logits(logits, top_k=2, routing=tr, impl="pallas_triton")


def test_resolve_route_impl_on_cpu():
  if jax.devices()[0].platform == "gpu":
    pytest.skip("CPU behaviour")
  assert tri.resolve_route_impl("auto") == "xla"
  assert "CUDA GPU" in tri.pallas_triton_unavailable_reason()
  assert tri.pallas_triton_unavailable_reason(interpret=True) is None
  assert tri.jax_triton_unavailable_reason()


def test_jax_triton_impl_says_why_it_cannot_run():
  reason = tri.jax_triton_unavailable_reason()
  if reason is None:
    pytest.skip("jax-triton runs here")
  logits = _logits(8, 6)
  plan = routing.route_logits(logits, top_k=2)
  y = jnp.ones((plan.capacity, 64), jnp.bfloat16)
  for call in (lambda: tri.topk_softmax(logits, 2),
               lambda: tri.routing_metadata(plan.expert_ids, num_experts=6, top_k=2),
               lambda: tri.combine(y, plan, plan.scores, jnp.bfloat16)):
    with pytest.raises(RuntimeError, match="impl='jax_triton' is not available"):
      call()


def test_validation_errors():
  logits = _logits(8, 6)
  with pytest.raises(ValueError, match="logits must have shape"):
    tri.topk_softmax(logits[0], 2, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="logits must be floating"):
    tri.topk_softmax(logits.astype(jnp.int32), 2, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="top_k must be an int"):
    tri.topk_softmax(logits, 7, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="impl must be one of"):
    tri.topk_softmax(logits, 2, impl="cuda")
  with pytest.raises(ValueError, match="interpret=True needs impl='pallas_triton'"):
    tri.topk_softmax(logits, 2, impl="jax_triton", interpret=True)
  with pytest.raises(ValueError, match="block_t must be a power of two"):
    tri.TopKConfig(block_t=3)
  e_ids = jnp.zeros((12,), jnp.int32)
  with pytest.raises(ValueError, match="expert_ids must be an integer"):
    tri.routing_metadata(e_ids.astype(jnp.float32), num_experts=4, top_k=2,
                         impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="expert_ids must have shape"):
    tri.routing_metadata(e_ids[None], num_experts=4, top_k=2, impl="pallas_triton",
                         interpret=True)
  with pytest.raises(ValueError, match="must hold T\\*K pairs"):
    tri.routing_metadata(e_ids, num_experts=4, top_k=5, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="token_ids must have the shape"):
    tri.routing_metadata(e_ids, num_experts=4, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="num_experts must be a positive int"):
    tri.routing_metadata(e_ids, num_experts=0, top_k=2, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="chunk must be a power of two"):
    tri.MetadataConfig(chunk=100)
  plan = routing.route_logits(logits, top_k=2)
  y = jnp.zeros((plan.capacity, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="y must have shape"):
    tri.combine(y[1:], plan, None, jnp.bfloat16, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="scores must have shape"):
    tri.combine(y, plan, plan.scores[1:], jnp.bfloat16, impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="multiple of 8"):
    tri.combine(jnp.zeros((plan.capacity, 12)), plan, None, jnp.float32,
                impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="multiple of CombineConfig.block_d"):
    tri.combine(y, plan, None, jnp.bfloat16, impl="pallas_triton", interpret=True,
                config=tri.CombineConfig(block_d=128))


# ---------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
@pytest.mark.parametrize("t,e,k", [(32768, 128, 8), (32768, 256, 16), (4096, 96, 6)])
def test_gpu_topk_softmax(impl, t, e, k):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  logits = _logits(t, e, seed=20)
  probs, experts = jax.jit(lambda x: tri.topk_softmax(x, k, impl=impl))(logits)
  ref_p, ref_e = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
  experts, ref_e = np.asarray(experts), np.asarray(ref_e)
  # Rows may differ only where XLA's fp32 probabilities tie two different logits.
  bad = np.nonzero(np.any(experts != ref_e, axis=1))[0]
  p_all = np.asarray(jax.nn.softmax(logits, axis=-1))
  for r in bad:
    mine, theirs = np.sort(p_all[r, experts[r]]), np.sort(p_all[r, ref_e[r]])
    np.testing.assert_array_equal(mine, theirs, err_msg=f"row {r}")
  assert len(bad) <= t // 1000
  assert rel_err(np.sort(np.asarray(probs), 1), np.sort(np.asarray(ref_p), 1)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
@pytest.mark.parametrize("t,e,k,skew", [(32768, 128, 8, "none"), (32768, 256, 16, "none"),
                                        (32768, 256, 8, "one"), (24576, 128, 8, "empty"),
                                        (3000, 96, 6, "none")])
def test_gpu_metadata_exact(impl, t, e, k, skew):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  tokens, experts, scores = _flat_assignments(t, e, k, seed=21, skew=skew)
  ref = jax.jit(lambda a, b, c: RoutingPlan.from_assignments(
      a, b, c, num_tokens=t, num_experts=e, top_k=k))(tokens, experts, scores)
  plan = jax.jit(lambda a, b, c: tri.plan_from_assignments(
      a, b, c, num_tokens=t, num_experts=e, top_k=k, impl=impl))(tokens, experts, scores)
  _assert_same_plan(plan, ref, scores_tol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
def test_gpu_metadata_token_rounding(impl):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  t, e, k = 8192, 64, 4
  ref = routing.route_logits(_logits(t, e, seed=22), top_k=k, routing=TokenRounding())
  plan = tri.plan_from_assignments(ref.token_ids, ref.expert_ids, ref.scores, num_tokens=t,
                                   num_experts=e, valid=ref.valid_mask(), impl=impl)
  _assert_same_plan(plan, ref, scores_tol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("t,e,k,d", [(32768, 128, 8, 1536), (1000, 12, 3, 136)])
def test_gpu_combine(impl, weighted, t, e, k, d):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  plan = routing.route_logits(_logits(t, e, seed=23), top_k=k)
  y = jax.random.normal(jax.random.key(24), (plan.capacity, d)).astype(jnp.bfloat16)
  scores = plan.scores if weighted else None
  out = jax.jit(lambda y_: tri.combine(y_, plan, scores, jnp.bfloat16, impl=impl))(y)
  ref = XlaKernels().combine(y, plan, scores, jnp.bfloat16)
  assert rel_err(out, ref) < 1e-2
  out32 = jax.jit(lambda y_: tri.combine(y_, plan, scores, jnp.float32, impl=impl))(y)
  assert rel_err(out32, XlaKernels().combine(y, plan, scores, jnp.float32)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
@pytest.mark.parametrize("method", ["scatter", "gather"])
@pytest.mark.parametrize("t,e,k,d", [(32768, 128, 8, 4096), (1000, 12, 3, 136)])
def test_gpu_dispatch(impl, method, t, e, k, d):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  plan, x, want = _dispatch_case(t, e, k, d)
  cfg = tri.DispatchConfig(method=method, block_t=2 if method == "scatter" else 4)
  out = np.asarray(jax.jit(lambda x_: tri.dispatch(x_, plan, impl=impl, config=cfg))(x),
                   np.float32)
  assert not np.any(np.isnan(out))
  np.testing.assert_array_equal(out, want)


@functools.cache
def _dispatch_case(t, e, k, d):
  """(plan, x, x[gather_idx] as float32 numpy), built once per shape for all four variants."""
  plan = jax.jit(lambda lg: routing.route_logits(lg, top_k=k))(_logits(t, e, seed=25))
  x = jax.random.normal(jax.random.key(26), (t, d)).astype(jnp.bfloat16)
  return plan, x, np.asarray(x[plan.gather_idx], np.float32)


def test_moe_routing_impl_auto_matches_xla():
  """sonic_jax.moe(routing_impl="auto") gives the xla-routed layer's output (any impl it picks
  makes the same plan; on the CPU "auto" is "xla")."""
  from tests.helpers import Problem, make_inputs, rel_err
  import sonic_jax
  args = make_inputs(Problem(T=32, d=16, n=8, E=6, K=2))
  want = sonic_jax.moe(*args, top_k=2, backend="xla")
  got = sonic_jax.moe(*args, top_k=2, backend="xla", routing_impl="auto")
  assert rel_err(got, want) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_gpu_default_routing_is_auto_and_matches_xla(backend):
  """On a GPU the layer's default routing (routing_impl="auto") runs the Triton kernels; output
  and every gradient equal the xla-routed layer's (same plan, bit for bit), directly, in the Flax
  module and under jax.vmap."""
  import flax.nnx as nnx
  import sonic_jax
  from sonic_jax.nn import MoE
  from tests.helpers import Problem, make_inputs
  assert tri.resolve_route_impl("auto") in tri.IMPLS
  t = 2048 if backend == "xla" else 8192
  args = make_inputs(Problem(T=t, d=256, n=128, E=32, K=4), dtype=jnp.bfloat16)

  def loss(impl):
    def f(*a):
      return jnp.sum(sonic_jax.moe(*a, top_k=4, backend=backend, routing_impl=impl)
                     .astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(*args)

  (v, g), (v_ref, g_ref) = loss("auto"), loss("xla")
  assert np.isfinite(float(v)) and abs(float(v) - float(v_ref)) <= 1e-3 * abs(float(v_ref))
  for name, a, b in zip(("dx", "drouter_w", "dw1", "dw2"), g, g_ref):
    assert rel_err(a, b) < 1e-3, name
  layer = MoE(256, 128, 32, 4, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, backend=backend)
  assert layer.routing_impl == "auto"
  x = args[0].reshape(4, -1, 256)
  out = nnx.jit(lambda m, x: m(x))(layer, x)
  layer.routing_impl = "xla"
  ref = nnx.jit(lambda m, x: m(x))(layer, x)
  assert rel_err(out, ref) < 1e-3
  vm = jax.jit(jax.vmap(lambda xb: sonic_jax.moe(xb, *args[1:], top_k=4, backend=backend)))(x)
  ref_vm = jnp.stack([sonic_jax.moe(xb, *args[1:], top_k=4, backend=backend,
                                    routing_impl="xla") for xb in x])
  assert rel_err(vm, ref_vm) < 1e-3


def test_bench_cpu_smoke(tmp_path, capsys):
  """The GPU timing script runs end to end on the CPU (xla variants, wall clock) and checks."""
  import json
  from sonic_jax.triton import bench
  bench.main(["--out", str(tmp_path), "--cpu-smoke", "--iters", "2"])
  doc = json.loads((tmp_path / "triton-bench.json").read_text())
  rows = {(r["kind"], r.get("piece", r.get("config")), r["impl"]): r for r in doc["rows"]}
  full = rows[("routing", "full", "xla")]
  assert full["check"] == "exact" and full["ms"] > 0
  comb = rows[("combine", "", "xla")]
  assert comb["rel_err"] == 0.0 and comb["TBps"] > 0
  assert doc["env"]["copy_TBps"] > 0
  assert "copy bandwidth" in capsys.readouterr().out


def test_jax_triton_call_passes_arrays_then_scalars_and_loops_under_vmap(monkeypatch):
  """jax-triton is not installed on CPUs: a stand-in triton_call records what the launch helper
  passes (arrays first, then the scalars, then the keywords); under vmap it becomes the body of
  a loop over the batch and only ever sees one element's arrays."""
  import sys
  import types
  seen = []

  def triton_call(*args, kernel, out_shape, **kw):
    seen.append((tuple(getattr(a, "shape", a) for a in args), kernel, kw))
    x, y, n = args
    return x * n + y

  monkeypatch.setitem(sys.modules, "jax_triton", types.SimpleNamespace(triton_call=triton_call))
  x, y = jnp.arange(6.0).reshape(3, 2), jnp.ones((3, 2))
  out = tri.jax_triton_call(x, y, scalars=(5,), kernel="k", out_shape=None, grid=(1,))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x * 5 + y))
  assert seen == [(((3, 2), (3, 2), 5), "k", {"grid": (1,)})]
  seen.clear()
  out = jax.vmap(lambda a: tri.jax_triton_call(a, y[0], scalars=(2,), kernel="k",
                                               out_shape=None))(x)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x * 2 + y))
  # One traced loop body over the batch, which sees a single element's shapes.
  assert [s[0] for s in seen] == [((2,), (2,), 2)]
