"""route(x, router_w) / router_top_k: the plan of route_logits, gradients without saved logits.

``route`` recomputes the router GEMM in the backward instead of keeping the (T, E) fp32 logits
through the expert block's backward. These tests check that the plan is route_logits' bit for
bit, that the gradients in x, router_w and logit_bias match plain autodiff of route_logits, and
that no (T, E) tensor is among the backward's residuals.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sonic_jax
from sonic_jax import routing
from sonic_jax.routing import router_logits
from tests.helpers import gpu_triton_impls, rel_err

_FIELDS = ("group_sizes", "group_offsets", "gather_idx", "scatter_idx", "reverse_idx",
           "token_ids", "expert_ids", "token_offsets")
# (T, d, E, K, bias): bias "none", "skew" (expert 0 hot, experts 1 and E-1 never chosen).
_CASES = [(40, 16, 8, 2, "none"), (33, 24, 12, 3, "skew"), (20, 8, 6, 6, "none")]
_IMPLS = [("xla", False), ("pallas_triton", True)]


def _inputs(t, d, e, bias, dtype=jnp.float32, seed=0):
  kx, kw = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (t, d), jnp.float32).astype(dtype)
  rw = (jax.random.normal(kw, (d, e), jnp.float32) / np.sqrt(d)).astype(dtype)
  b = None
  if bias == "skew":
    b = jnp.zeros((e,), jnp.float32).at[0].set(4.0).at[1].set(-30.0).at[e - 1].set(-30.0)
  return x, rw, b


def _reference_plan(x, rw, b, k, renormalize):
  logits = router_logits(x, rw)
  if b is not None:
    logits = logits + b
  return routing.route_logits(logits, top_k=k, renormalize=renormalize)


def _route(x, rw, b, k, renormalize, impl, interpret):
  return routing.route(x, rw, top_k=k, renormalize=renormalize, impl=impl, logit_bias=b,
                       interpret=interpret)


@pytest.mark.parametrize("impl,interpret", _IMPLS)
@pytest.mark.parametrize("t,d,e,k,bias", _CASES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_plan_is_route_logits_plan(impl, interpret, t, d, e, k, bias, renormalize):
  x, rw, b = _inputs(t, d, e, bias, jnp.bfloat16)
  plan = _route(x, rw, b, k, renormalize, impl, interpret)
  ref = _reference_plan(x, rw, b, k, renormalize)
  for f in _FIELDS:
    np.testing.assert_array_equal(np.asarray(getattr(plan, f)), np.asarray(getattr(ref, f)),
                                  err_msg=f)
  assert plan.top_k == k and plan.capacity == t * k
  assert rel_err(plan.scores, ref.scores) <= 1e-6
  if bias == "skew":  # the bias reached the selection: expert 0 everywhere, two never
    sizes = np.asarray(plan.group_sizes)
    assert sizes[0] == t and sizes[1] == 0 and sizes[e - 1] == 0


@pytest.mark.parametrize("impl,interpret", _IMPLS)
@pytest.mark.parametrize("t,d,e,k,bias", _CASES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_gradients_match_autodiff_of_route_logits(impl, interpret, t, d, e, k, bias,
                                                        renormalize):
  """Renormalized scores differentiate from the (T, K) scores alone, raw probabilities
  through the recomputed softmax: both equal autodiff of route_logits."""
  x, rw, b = _inputs(t, d, e, bias)
  b = jnp.linspace(-0.5, 0.5, e) if b is None else b
  w = jax.random.normal(jax.random.key(5), (t * k,), jnp.float32)

  def loss(fn):
    return lambda x, rw, b: jnp.sum(fn(x, rw, b).scores * w)

  got = jax.grad(loss(lambda x, rw, b: _route(x, rw, b, k, renormalize, impl, interpret)),
                 argnums=(0, 1, 2))(x, rw, b)
  want = jax.grad(loss(lambda x, rw, b: _reference_plan(x, rw, b, k, renormalize)),
                  argnums=(0, 1, 2))(x, rw, b)
  for name, g, r in zip(("dx", "drouter_w", "dlogit_bias"), got, want):
    assert g.shape == r.shape and g.dtype == r.dtype, name
    assert np.all(np.isfinite(np.asarray(g))), name
    assert float(jnp.linalg.norm(r)) > 1e-3, name  # a real gradient, not a vanishing one
    assert rel_err(g, r) <= 1e-5, (name, rel_err(g, r))


@pytest.mark.parametrize("impl,interpret", _IMPLS)
def test_route_bf16_gradients_against_float32_reference(impl, interpret):
  """bf16 x / router_w (training): the backward's GEMMs take dl in bf16 with fp32 accumulation.
  Against the float32 reference (route_logits' autodiff on the same values in fp32)."""
  t, d, e, k = 96, 64, 16, 4
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16, seed=2)
  b = jnp.linspace(-0.5, 0.5, e)
  w = jax.random.normal(jax.random.key(6), (t * k,), jnp.float32)
  got = jax.grad(lambda x, rw, b: jnp.sum(_route(x, rw, b, k, True, impl, interpret).scores * w),
                 argnums=(0, 1, 2))(x, rw, b)
  x32, rw32 = x.astype(jnp.float32), rw.astype(jnp.float32)
  want = jax.grad(lambda x, rw, b: jnp.sum(_reference_plan(x, rw, b, k, True).scores * w),
                  argnums=(0, 1, 2))(x32, rw32, b)
  for name, g, r, dtype in zip(("dx", "drouter_w", "dlogit_bias"), got, want,
                               (jnp.bfloat16, jnp.bfloat16, jnp.float32)):
    assert g.dtype == dtype, name
    assert np.all(np.isfinite(np.asarray(g, np.float32))), name
    assert float(jnp.linalg.norm(r)) > 1e-3, name
    assert rel_err(g, r) <= (1e-5 if dtype == jnp.float32 else 8e-3), (name, rel_err(g, r))


@pytest.mark.parametrize("impl,interpret", _IMPLS)
def test_route_gradients_under_vmap(impl, interpret):
  """A batch of token sets routed under vmap (shared router_w): per-element gradients and the
  gradient of the batched sum match autodiff of route_logits."""
  b, t, d, e, k = 3, 24, 16, 8, 2
  x = jax.random.normal(jax.random.key(20), (b, t, d), jnp.float32)
  rw = jax.random.normal(jax.random.key(21), (d, e), jnp.float32) / 4
  w = jax.random.normal(jax.random.key(22), (t * k,), jnp.float32)

  def got(x, rw):
    return jnp.sum(_route(x, rw, None, k, True, impl, interpret).scores * w)

  def want(x, rw):
    return jnp.sum(_reference_plan(x, rw, None, k, True).scores * w)

  per_elem = [jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(0, None))(x, rw)
              for f in (got, want)]
  summed = [jax.grad(lambda x, rw, f=f: jnp.sum(jax.vmap(f, in_axes=(0, None))(x, rw)),
                     argnums=(0, 1))(x, rw) for f in (got, want)]
  for g, r in zip(per_elem[0] + summed[0], per_elem[1] + summed[1]):
    assert float(jnp.linalg.norm(r)) > 1e-3
    assert rel_err(g, r) <= 1e-5


def _residual_shapes(fn, *args):
  _, pullback = jax.vjp(fn, *args)
  return [(tuple(a.shape), a.dtype) for a in jax.tree_util.tree_leaves(pullback)
          if hasattr(a, "shape")]


@pytest.mark.parametrize("impl,interpret", _IMPLS)
def test_route_keeps_no_logits_for_the_backward(impl, interpret):
  t, d, e, k = 48, 16, 12, 2
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16)
  shapes = _residual_shapes(
      lambda x, rw: _route(x, rw, None, k, True, impl, interpret).scores, x, rw)
  assert not [s for s in shapes if s[0] == (t, e)], shapes
  # The check can fail: autodiff of route_logits keeps a (T, E) tensor.
  ref_shapes = _residual_shapes(
      lambda x, rw: _reference_plan(x, rw, None, k, True).scores, x, rw)
  assert [s for s in ref_shapes if s[0] == (t, e)], ref_shapes


@pytest.mark.parametrize("impl,interpret", _IMPLS)
@pytest.mark.parametrize("routing_name", ["topk", "token_rounding"])
def test_route_mean_probs_and_load_balancing_gradients(impl, interpret, routing_name):
  """return_mean_probs: mean_t softmax (E,) and the balance loss built on it, with the plan's
  scores, differentiate like autodiff of route_logits + load_balancing_loss(logits)."""
  t, d, e, k = 40, 16, 8, 2
  x, rw, _ = _inputs(t, d, e, "none")
  b = jnp.linspace(-0.5, 0.5, e)
  rounding = sonic_jax.TokenRounding(tile=4) if routing_name == "token_rounding" else "topk"
  w = jax.random.normal(jax.random.key(8), (routing.TokenRounding(tile=4).capacity(t, e, k)
                                            if routing_name == "token_rounding" else t * k,))

  def got_loss(x, rw, b):
    plan, mean_p = routing.route(x, rw, top_k=k, routing=rounding, impl=impl, logit_bias=b,
                                 interpret=interpret, return_mean_probs=True)
    return jnp.sum(plan.scores * w) + 3.0 * routing.load_balancing_loss_from_mean(mean_p, plan)

  def want_loss(x, rw, b):
    logits = router_logits(x, rw) + b
    plan = routing.route_logits(logits, top_k=k, routing=rounding)
    return jnp.sum(plan.scores * w) + 3.0 * routing.load_balancing_loss(logits, plan)

  plan, mean_p = routing.route(x, rw, top_k=k, routing=rounding, impl=impl, logit_bias=b,
                               interpret=interpret, return_mean_probs=True)
  assert mean_p.shape == (e,) and mean_p.dtype == jnp.float32
  want_mean = jnp.mean(jax.nn.softmax(router_logits(x, rw) + b, axis=-1), axis=0)
  assert rel_err(mean_p, want_mean) <= 1e-6
  np.testing.assert_allclose(float(got_loss(x, rw, b)), float(want_loss(x, rw, b)), rtol=1e-6)
  got = jax.grad(got_loss, argnums=(0, 1, 2))(x, rw, b)
  want = jax.grad(want_loss, argnums=(0, 1, 2))(x, rw, b)
  for name, g, r in zip(("dx", "drouter_w", "dlogit_bias"), got, want):
    assert np.all(np.isfinite(np.asarray(g))), name
    assert float(jnp.linalg.norm(r)) > 1e-3, name
    assert rel_err(g, r) <= 1e-5, (name, rel_err(g, r))
  # The balance loss alone (the scores' cotangent zero) reaches the router too.
  def aux_loss(rw):
    plan, mean_p = routing.route(x, rw, top_k=k, routing=rounding, impl=impl,
                                 interpret=interpret, return_mean_probs=True)
    return routing.load_balancing_loss_from_mean(mean_p, plan)

  aux_only = jax.grad(aux_loss)(rw)
  aux_want = jax.grad(lambda rw: routing.load_balancing_loss(
      router_logits(x, rw), routing.route_logits(router_logits(x, rw), top_k=k,
                                                 routing=rounding)))(rw)
  assert float(jnp.linalg.norm(aux_want)) > 1e-4
  assert rel_err(aux_only, aux_want) <= 1e-5


def _dot_count(fn, *args) -> int:
  """GEMMs in the compiled program (the jaxpr also holds jax.vjp's unused primal dots)."""
  return len(re.findall(r"= \S+ dot\(", jax.jit(fn).lower(*args).compile().as_text()))


@pytest.mark.parametrize("bias", [False, True])
def test_renormalized_backward_does_not_recompute_the_router_gemm(bias):
  """Renormalized top-K scores: forward GEMM + the backward's dx and d router_w GEMMs (3);
  raw probabilities and the mean probabilities recompute the logits (a fourth)."""
  t, d, e, k = 48, 16, 12, 2
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16)
  b = jnp.linspace(-0.5, 0.5, e) if bias else None

  def grad_of(renormalize, mean):
    def loss(x, rw):
      out = routing.route(x, rw, top_k=k, renormalize=renormalize, logit_bias=b,
                          return_mean_probs=mean)
      plan, extra = out if mean else (out, 0.0)
      return jnp.sum(plan.scores) + jnp.sum(extra)
    return jax.grad(loss, argnums=(0, 1))

  assert _dot_count(grad_of(True, False), x, rw) == 3
  assert _dot_count(grad_of(False, False), x, rw) == 4
  assert _dot_count(grad_of(True, True), x, rw) == 4


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_gradients_inside_shard_map(renormalize):
  """Tokens sharded, router_w and the bias replicated: their cotangents are summed over the
  shards (jax.vjp in the backward), equal to the unsharded gradients."""
  t, d, e, k = 64, 16, 8, 2
  x, rw, _ = _inputs(t, d, e, "none")
  b = jnp.linspace(-0.5, 0.5, e)
  w = jax.random.normal(jax.random.key(9), (t, k), jnp.float32)
  mesh = jax.make_mesh((len(jax.devices()),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  spec = jax.sharding.PartitionSpec

  def scores(x, rw, b):
    return routing.route(x, rw, top_k=k, renormalize=renormalize, logit_bias=b).scores

  def sharded_loss(x, rw, b):
    f = jax.shard_map(lambda x, rw, b: scores(x, rw, b).reshape(-1, k), mesh=mesh,
                      in_specs=(spec("data"), spec(), spec()), out_specs=spec("data"))
    return jnp.sum(f(x, rw, b) * w)

  got = jax.jit(jax.grad(sharded_loss, argnums=(0, 1, 2)))(x, rw, b)
  want = jax.grad(lambda x, rw, b: jnp.sum(scores(x, rw, b).reshape(-1, k) * w),
                  argnums=(0, 1, 2))(x, rw, b)
  for name, g, r in zip(("dx", "drouter_w", "dlogit_bias"), got, want):
    assert float(jnp.linalg.norm(r)) > 1e-3, name
    assert rel_err(g, r) <= 1e-5, (name, rel_err(g, r))


def test_route_with_mean_probs_keeps_no_logits_for_the_backward():
  t, d, e, k = 48, 16, 12, 2
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16)

  def f(x, rw):
    plan, mean_p = routing.route(x, rw, top_k=k, return_mean_probs=True)
    return jnp.sum(plan.scores) + routing.load_balancing_loss_from_mean(mean_p, plan)

  shapes = _residual_shapes(f, x, rw)
  assert not [s for s in shapes if s[0] == (t, e)], shapes
  # load_balancing_loss on the logits keeps the (T, E) softmax for its backward.
  ref = _residual_shapes(lambda x, rw: routing.load_balancing_loss(
      router_logits(x, rw), routing.route(x, rw, top_k=k)), x, rw)
  assert [s for s in ref if s[0] == (t, e)], ref


def test_moe_gradients_unchanged_by_recomputed_router():
  """The whole layer's router gradient through sonic_jax.moe equals that of a plan built from
  route_logits (the path before route() recomputed the logits)."""
  t, d, e, k, n = 32, 16, 6, 2, 8
  x, rw, _ = _inputs(t, d, e, "none")
  k1, k2 = jax.random.split(jax.random.key(3))
  w1 = jax.random.normal(k1, (e, d, 2 * n), jnp.float32) * 0.2
  w2 = jax.random.normal(k2, (e, n, d), jnp.float32) * 0.2

  def via_moe(x, rw):
    return jnp.sum(sonic_jax.moe(x, rw, w1, w2, top_k=k, backend="xla", routing_impl="xla") ** 2)

  def via_logits(x, rw):
    plan = _reference_plan(x, rw, None, k, True)
    return jnp.sum(sonic_jax.moe_experts(x, plan, w1, w2, backend="xla") ** 2)

  got = jax.grad(via_moe, argnums=(0, 1))(x, rw)
  want = jax.grad(via_logits, argnums=(0, 1))(x, rw)
  for g, r in zip(got, want):
    assert float(jnp.linalg.norm(r)) > 1e-3
    assert rel_err(g, r) <= 1e-5


def test_router_top_k_matches_softmax_top_k():
  x, rw, b = _inputs(24, 16, 10, "none")
  p, ex = routing.router_top_k(x, rw, 3)
  want_p, want_e = jax.lax.top_k(jax.nn.softmax(router_logits(x, rw), -1), 3)
  np.testing.assert_array_equal(ex, want_e)
  assert p.dtype == jnp.float32 and rel_err(p, want_p) <= 1e-6


def test_route_validation():
  x, rw, _ = _inputs(8, 4, 6, "none")
  with pytest.raises(ValueError, match=r"logit_bias .*shape \(E,\) = \(6,\)"):
    routing.route(x, rw, top_k=2, logit_bias=jnp.zeros((5,)))
  with pytest.raises(ValueError, match="logit_bias must be None or a float"):
    routing.route(x, rw, top_k=2, logit_bias=jnp.zeros((6,), jnp.int32))
  with pytest.raises(ValueError, match="top_k must satisfy 1 <= top_k <= num_experts"):
    routing.route(x, rw, top_k=7)
  with pytest.raises(ValueError, match="router_w must have shape"):
    routing.route(x, rw[:3], top_k=2)
  with pytest.raises(ValueError, match="impl must be 'xla', 'jax_triton' or 'pallas_triton'"):
    routing.router_top_k(x, rw, 2, impl="auto")
  with pytest.raises(ValueError, match="routing must be"):
    routing.route(x, rw, top_k=2, routing="nope")


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("impl", gpu_triton_impls())
def test_gpu_route_matches_route_logits(impl):
  """Qwen3-30B-A3B's router shape (T = 16384, d = 2048, E = 128, K = 8): the plan equals
  route_logits' (xla) bit for bit, gradients match autodiff of it, no (T, E) residual."""
  t, d, e, k = 16384, 2048, 128, 8
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16, seed=11)
  b = jnp.linspace(-1.0, 1.0, e)
  plan = jax.jit(lambda x, rw, b: _route(x, rw, b, k, True, impl, False))(x, rw, b)
  ref = jax.jit(lambda x, rw, b: _reference_plan(x, rw, b, k, True))(x, rw, b)
  for f in _FIELDS:
    np.testing.assert_array_equal(np.asarray(getattr(plan, f)), np.asarray(getattr(ref, f)),
                                  err_msg=f)
  assert rel_err(plan.scores, ref.scores) <= 1e-6
  w = jax.random.normal(jax.random.key(5), (t * k,), jnp.float32)

  def grads(fn):
    return jax.jit(jax.grad(lambda x, rw, b: jnp.sum(fn(x, rw, b).scores * w),
                            argnums=(0, 1, 2)))(x, rw, b)

  got = grads(lambda x, rw, b: _route(x, rw, b, k, True, impl, False))
  want = grads(lambda x, rw, b: _reference_plan(x, rw, b, k, True))
  for name, g, r in zip(("dx", "drouter_w", "dlogit_bias"), got, want):
    assert np.all(np.isfinite(np.asarray(g, np.float32))), name
    assert rel_err(g, r) <= 1e-2, (name, rel_err(g, r))  # dx, drouter_w are bf16
  shapes = _residual_shapes(lambda x, rw: _route(x, rw, None, k, True, impl, False).scores,
                            x, rw)
  assert not [s for s in shapes if s[0] == (t, e)], shapes


@pytest.mark.gpu
@pytest.mark.parametrize("impl", gpu_triton_impls())
def test_gpu_route_mean_probs_gradients(impl):
  """return_mean_probs at Qwen3's router shape: scores + balance loss gradients against autodiff
  of route_logits + load_balancing_loss (bf16 x / router_w)."""
  t, d, e, k = 16384, 2048, 128, 8
  x, rw, _ = _inputs(t, d, e, "none", jnp.bfloat16, seed=12)
  w = jax.random.normal(jax.random.key(9), (t * k,), jnp.float32)

  def got_loss(x, rw):
    plan, mean_p = routing.route(x, rw, top_k=k, impl=impl, return_mean_probs=True)
    return jnp.sum(plan.scores * w) + 30.0 * routing.load_balancing_loss_from_mean(mean_p, plan)

  def want_loss(x, rw):
    logits = router_logits(x, rw)
    plan = routing.route_logits(logits, top_k=k)
    return jnp.sum(plan.scores * w) + 30.0 * routing.load_balancing_loss(logits, plan)

  got = jax.jit(jax.grad(got_loss, argnums=(0, 1)))(x, rw)
  want = jax.jit(jax.grad(want_loss, argnums=(0, 1)))(x, rw)
  for name, g, r in zip(("dx", "drouter_w"), got, want):
    assert np.all(np.isfinite(np.asarray(g, np.float32))), name
    assert rel_err(g, r) <= 1e-2, (name, rel_err(g, r))
