"""The custom_vjp saves only x, H, the fp32 scores and the routing plan (plus the weights)."""

import jax
import jax.numpy as jnp
import numpy as np

import sonic_jax
from tests.helpers import Problem, make_inputs


def _residuals(fn, *args):
  """(shape, dtype) of every array the backward pass keeps: the leaves of the vjp closure."""
  _, vjp_fn = jax.vjp(fn, *args)
  return [(tuple(a.shape), a.dtype) for a in jax.tree.leaves(vjp_fn)]


def test_expert_block_saves_only_x_h_scores_and_plan():
  p = Problem(T=128, d=64, n=96, E=8, K=4)
  x, rw, w1, w2 = make_inputs(p, jnp.bfloat16)
  plan = sonic_jax.route(x, rw, top_k=p.K)
  P = p.T * p.K

  def f(x, scores, w1, w2):
    return sonic_jax.moe_experts(x, plan.replace(scores=scores), w1, w2, backend="xla")

  res = _residuals(f, x, plan.scores, w1, w2)
  shapes = [r[0] for r in res]
  # Never A (P, n), Y or gathered x (P, d).
  assert (P, p.n) not in shapes and (P, p.d) not in shapes
  assert (P, 2 * p.n) in shapes  # H
  activation_bytes = sum(int(np.prod(s)) * jnp.dtype(dt).itemsize for s, dt in res
                         if s not in (w1.shape, w2.shape))
  budget = 2 * p.T * p.d + 4 * P * p.n          # x and H in bf16
  routing = 4 * (8 * P + p.T + 2 * p.E + 2)      # fp32 scores + int32 plan arrays
  assert activation_bytes <= budget + routing, (activation_bytes, budget, routing, res)
  assert activation_bytes >= budget  # x and H really are there


def test_full_layer_saves_no_pair_activation_besides_h():
  p = Problem(T=64, d=32, n=48, E=4, K=2)
  args = make_inputs(p, jnp.bfloat16)
  res = _residuals(lambda *a: sonic_jax.moe(*a, top_k=p.K, backend="xla"), *args)
  P = p.T * p.K
  big = [r for r in res if r[0] in ((P, p.n), (P, p.d))]
  assert not big, big


def _step_bytes(kern, p, args):
  """Bytes above the inputs of the layer benchmark's training step, and its gradients."""
  from sonic_jax.bench.runner import fwdbwd_step
  step = fwdbwd_step(lambda *a: sonic_jax.moe(*a, top_k=p.K, backend=kern))
  ct = jax.random.normal(jax.random.key(9), args[0].shape, jnp.float32).astype(args[0].dtype)
  compiled = jax.jit(step).lower(*args, ct).compile()
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes, jax.jit(step)(*args, ct)[1]


def test_dw1_last_gathers_x_after_dx_and_lowers_peak_memory():
  """ExpertKernels.dw1_last: the (P, d) gathered x is not live with the gathered dO / dX_pairs."""
  from sonic_jax.xla_backend import XlaKernels

  class Early(XlaKernels):
    dw1_last = False

  p = Problem(T=1024, d=512, n=128, E=8, K=2)
  args = make_inputs(p, jnp.bfloat16)
  late_bytes, late = _step_bytes(XlaKernels(), p, args)
  early_bytes, early = _step_bytes(Early(), p, args)
  pair_rows_bytes = p.T * p.K * p.d * 2  # one (P, d) bf16 copy
  assert late_bytes <= early_bytes - pair_rows_bytes, (late_bytes, early_bytes)
  for a, b in zip(late, early):  # same gradients (dx up to bf16 rounding of fused sums)
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.isfinite(a).all()
    assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b)
