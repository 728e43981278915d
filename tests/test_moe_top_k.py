"""moe_top_k: top-K routing and the expert block differentiated by one custom_vjp.

``sonic_jax.moe`` (top-K) and the Flax modules run it. It must give the values and gradients of
``route`` followed by ``moe_experts`` (the two custom_vjps whose cotangents autodiff adds), while
the router's x-gradient joins the experts' dx combine (``ExpertKernels.combine_add``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sonic_jax
from sonic_jax import routing
from sonic_jax.experts import moe_top_k
from sonic_jax.pallas.backend import PallasKernels
from sonic_jax.pallas.configs import CombineConfig, ForwardConfig
from sonic_jax.reference import moe_reference
from sonic_jax.xla_backend import XlaKernels
from tests.helpers import Problem, make_inputs, rel_err

_FIELDS = ("group_sizes", "group_offsets", "gather_idx", "scatter_idx", "reverse_idx",
           "token_ids", "expert_ids", "token_offsets")


def _two_step(x, rw, w1, w2, b, *, k, renormalize, mean, backend):
  out = routing.route(x, rw, top_k=k, renormalize=renormalize, logit_bias=b,
                      return_mean_probs=mean)
  plan, mean_p = out if mean else (out, None)
  return sonic_jax.moe_experts(x, plan, w1, w2, backend=backend), plan, mean_p


def _joint(x, rw, w1, w2, b, *, k, renormalize, mean, backend):
  return moe_top_k(x, rw, w1, w2, top_k=k, renormalize=renormalize, logit_bias=b,
                   return_mean_probs=mean, backend=backend)


def _loss(layer, ct, **kw):
  def f(x, rw, w1, w2, b):
    out, plan, mean_p = layer(x, rw, w1, w2, b, **kw)
    loss = jnp.sum(out.astype(jnp.float32) * ct)
    if mean_p is not None:  # the load-balancing loss reaches the router through mean_p
      loss = loss + 3.0 * routing.load_balancing_loss_from_mean(mean_p, plan)
    return loss
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4)))


_PROBLEMS = [Problem(T=40, d=16, n=8, E=6, K=2), Problem(T=33, d=24, n=8, E=5, K=3, skew="empty"),
             Problem(T=24, d=16, n=8, E=4, K=2, skew="one")]


@pytest.mark.parametrize("p", _PROBLEMS, ids=lambda p: f"T{p.T}-E{p.E}-K{p.K}-{p.skew}")
@pytest.mark.parametrize("renormalize,mean,bias", [(True, False, False), (True, False, True),
                                                   (False, False, True), (True, True, False),
                                                   (False, True, True)])
def test_matches_route_then_moe_experts(p, renormalize, mean, bias):
  x, rw, w1, w2 = make_inputs(p)
  if p.skew == "one":  # expert 0 first for every token, its softmax not saturated (no 0 grads)
    rw = rw.at[0, 0].set(6.0)
  b = jnp.linspace(-0.5, 0.5, p.E) if bias else None
  ct = jax.random.normal(jax.random.key(7), (p.T, p.d), jnp.float32)
  kw = dict(k=p.K, renormalize=renormalize, mean=mean, backend="xla")
  out, plan, mean_p = _joint(x, rw, w1, w2, b, **kw)
  ref_out, ref_plan, ref_mean = _two_step(x, rw, w1, w2, b, **kw)
  assert rel_err(out, ref_out) <= 1e-6
  for f in _FIELDS:
    np.testing.assert_array_equal(np.asarray(getattr(plan, f)), np.asarray(getattr(ref_plan, f)))
  np.testing.assert_array_equal(np.asarray(plan.scores), np.asarray(ref_plan.scores))
  sizes = np.asarray(plan.group_sizes)
  assert {"one": sizes[0] == p.T, "empty": sizes[1] == sizes[-1] == 0}.get(p.skew, True), sizes
  if mean:
    assert rel_err(mean_p, ref_mean) <= 1e-6
  else:
    assert mean_p is None
  (val, got), (ref_val, want) = _loss(_joint, ct, **kw)(x, rw, w1, w2, b), _loss(
      _two_step, ct, **kw)(x, rw, w1, w2, b)
  np.testing.assert_allclose(float(val), float(ref_val), rtol=1e-6)
  for name, g, r in zip(("dx", "drouter_w", "dw1", "dw2", "dlogit_bias"), got, want):
    if r is None:
      assert g is None and not bias, name
      continue
    assert g.shape == r.shape and g.dtype == r.dtype, name
    assert float(jnp.linalg.norm(r)) > 1e-3, name
    assert rel_err(g, r) <= 1e-5, (name, rel_err(g, r))


def test_bf16_gradients_against_float32_reference():
  """bf16 operands: every gradient against the float32 layer reference's."""
  p = Problem(T=96, d=64, n=32, E=8, K=2, seed=3)
  x, rw, w1, w2 = make_inputs(p, jnp.bfloat16)
  ct = jax.random.normal(jax.random.key(8), (p.T, p.d), jnp.float32)

  def loss(fn):
    return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * ct),
                            argnums=(0, 1, 2, 3)))

  got = loss(lambda x, rw, w1, w2: sonic_jax.moe(x, rw, w1, w2, top_k=2, backend="xla"))(
      x, rw, w1, w2)
  f32 = [a.astype(jnp.float32) for a in (x, rw, w1, w2)]
  want = loss(lambda *a: moe_reference(*a, top_k=2))(*f32)
  for name, g, r in zip(("dx", "drouter_w", "dw1", "dw2"), got, want):
    assert g.dtype == jnp.bfloat16, name
    assert rel_err(g, r) <= 1.5e-2, (name, rel_err(g, r))


class _Recording(XlaKernels):
  """The xla backend noting which combine entry points the traced backward calls."""

  def __init__(self):
    self.calls = []

  def combine(self, y, plan, scores, out_dtype):
    self.calls.append("combine" if scores is not None else "combine(dx)")
    return super().combine(y, plan, scores, out_dtype)

  def combine_add(self, y, plan, addend, out_dtype):
    self.calls.append("combine_add")
    assert addend.shape == (plan.num_tokens, y.shape[1])
    return super().combine_add(y, plan, addend, out_dtype)


@pytest.mark.parametrize("dw1_last", [False, True])
def test_router_dx_is_the_addend_of_the_dx_combine(dw1_last):
  """The backward sums dx once, with the router's dx as the combine's addend; the result is
  the two-step path's dx (which adds the router's dx after the combine)."""
  p = Problem(T=32, d=16, n=8, E=4, K=2)
  x, rw, w1, w2 = make_inputs(p)
  kern = _Recording()
  kern.dw1_last = dw1_last
  ct = jax.random.normal(jax.random.key(9), (p.T, p.d), jnp.float32)
  dx = jax.grad(lambda x: jnp.sum(sonic_jax.moe(x, rw, w1, w2, top_k=2, backend=kern) * ct))(x)
  assert kern.calls == ["combine", "combine_add"], kern.calls
  kern.calls.clear()
  want = jax.grad(lambda x: jnp.sum(_two_step(x, rw, w1, w2, None, k=2, renormalize=True,
                                              mean=False, backend=kern)[0] * ct))(x)
  assert kern.calls == ["combine", "combine(dx)"], kern.calls
  assert rel_err(dx, want) <= 1e-5


def _plan_cases():
  t, e, k = 40, 6, 2
  cases = {}
  for name, bias in (("spread", None), ("empty", jnp.zeros((e,)).at[1].set(-50.).at[4].set(-50.)),
                     ("one", jnp.zeros((e,)).at[0].set(50.))):
    logits = jax.random.normal(jax.random.key(11), (t, e)) + (0 if bias is None else bias)
    cases[name] = routing.route_logits(logits, top_k=k)
  return cases


@pytest.mark.parametrize("case", ["spread", "empty", "one"])
@pytest.mark.parametrize("backend", ["xla", "pallas-xla-sum", "pallas-mosaic"])
def test_combine_add(case, backend):
  """combine_add = the unweighted combine plus the addend in fp32 (empty experts, all tokens on
  one expert, 40 tokens in blocks of 64 rows: the kernel's last block straddles the end)."""
  plan = _plan_cases()[case]
  d = 64
  y = jax.random.normal(jax.random.key(12), (plan.capacity, d), jnp.float32).astype(jnp.bfloat16)
  addend = jax.random.normal(jax.random.key(13), (plan.num_tokens, d)).astype(jnp.bfloat16)
  kern = {"xla": XlaKernels(),
          "pallas-xla-sum": PallasKernels(interpret=True),
          "pallas-mosaic": PallasKernels(interpret=True, config=ForwardConfig(
              combine=CombineConfig(impl="mosaic", block_d=64)))}[backend]
  want = (XlaKernels().combine(y, plan, None, jnp.float32) + addend.astype(jnp.float32))
  got = kern.combine_add(y, plan, addend, jnp.float32)
  assert got.dtype == jnp.float32
  assert rel_err(got, want) <= 1e-6
  got16 = kern.combine_add(y, plan, addend, jnp.bfloat16)
  assert got16.dtype == jnp.bfloat16 and rel_err(got16, want) <= 8e-3


def test_inside_shard_map_with_logit_bias():
  """Tokens sharded, router_w, logit_bias and the experts replicated: gradients summed over the
  shards equal the unsharded ones."""
  p = Problem(T=64, d=16, n=8, E=4, K=2)
  x, rw, w1, w2 = make_inputs(p)
  b = jnp.linspace(-0.3, 0.3, p.E)
  ct = jax.random.normal(jax.random.key(14), (p.T, p.d), jnp.float32)
  mesh = jax.make_mesh((len(jax.devices()),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  spec = jax.sharding.PartitionSpec

  def layer(x, rw, w1, w2, b):
    return moe_top_k(x, rw, w1, w2, top_k=2, logit_bias=b, backend="xla")[0]

  def sharded(*a):
    return jax.shard_map(layer, mesh=mesh, in_specs=(spec("data"),) + (spec(),) * 4,
                         out_specs=spec("data"))(*a)

  got = jax.jit(jax.grad(lambda *a: jnp.sum(sharded(*a) * ct), argnums=(0, 1, 2, 3, 4)))(
      x, rw, w1, w2, b)
  want = jax.grad(lambda *a: jnp.sum(layer(*a) * ct), argnums=(0, 1, 2, 3, 4))(x, rw, w1, w2, b)
  for name, g, r in zip(("dx", "drouter_w", "dw1", "dw2", "dlogit_bias"), got, want):
    assert rel_err(g, r) <= 1e-5, (name, rel_err(g, r))


def test_validation():
  p = Problem(T=16, d=8, n=4, E=4, K=2)
  x, rw, w1, w2 = make_inputs(p)
  with pytest.raises(ValueError, match="top_k"):
    moe_top_k(x, rw, w1, w2, top_k=5)
  with pytest.raises(ValueError, match="w1.shape"):
    moe_top_k(x, rw, w1[:3], w2, top_k=2)
  with pytest.raises(ValueError, match="router_w"):
    moe_top_k(x, rw[:4], w1, w2, top_k=2)
  with pytest.raises(ValueError, match="logit_bias"):
    moe_top_k(x, rw, w1, w2, top_k=2, logit_bias=jnp.zeros((3,)))


@pytest.mark.parametrize("renormalize,mean", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("dw1_last", [False, True])
def test_backward_computes_the_router_logits_at_most_once(renormalize, mean, dw1_last):
  """The compiled step's (T, E) router GEMMs: the forward's, plus one recompute in the backward
  for raw probabilities or the mean probabilities' gradient (the logit cotangent gives the
  router's dx, d router_w and d bias together), none for renormalized scores alone."""
  import re
  p = Problem(T=40, d=16, n=8, E=7, K=2)
  x, rw, w1, w2 = make_inputs(p)
  ct = jax.random.normal(jax.random.key(3), (p.T, p.d), jnp.float32)
  kern = type("_Xla", (XlaKernels,), {"dw1_last": dw1_last})()  # its own cached trace
  step = _loss(_joint, ct, k=p.K, renormalize=renormalize, mean=mean, backend=kern)
  hlo = step.lower(x, rw, w1, w2, jnp.zeros((p.E,))).compile().as_text()
  router_gemms = re.findall(rf"= \w+\[{p.T},{p.E}\]\S* dot\(", hlo)
  assert len(router_gemms) == (1 if renormalize and not mean else 2), router_gemms
