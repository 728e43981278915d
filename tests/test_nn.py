"""Flax modules: NNX MoE and the Linen wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import sonic_jax
from sonic_jax.nn import LOGICAL_AXES, MoE, MoELinen
from tests.helpers import rel_err


def _x(shape=(2, 12, 16)):
  return jax.random.normal(jax.random.key(3), shape)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow:DeprecationWarning")
def test_nnx_module_matches_functional_and_sows_aux():
  m = MoE(16, 24, 6, 2, rngs=nnx.Rngs(0), aux_loss_coef=0.5, backend="xla")
  x = _x()
  y = m(x)
  assert y.shape == x.shape
  want = sonic_jax.moe(x.reshape(-1, 16), m.router[...], m.w1[...], m.w2[...], top_k=2,
                       backend="xla").reshape(x.shape)
  assert rel_err(y, want) < 1e-6
  (aux,) = jax.tree.leaves(nnx.pop(m, nnx.Intermediate))
  y2, aux2 = m(x, return_aux_loss=True)
  assert rel_err(y2, y) == 0 and abs(float(aux) - float(aux2)) < 1e-6
  assert 0.5 <= float(aux2) < 0.5 * 6


def test_nnx_partition_specs_and_dtypes():
  m = MoE(16, 24, 6, 2, rngs=nnx.Rngs(0), param_dtype=jnp.float32, dtype=jnp.bfloat16,
          backend="xla")
  specs = nnx.get_partition_spec(nnx.state(m, nnx.Param))
  for name in ("router", "w1", "w2"):
    (spec,) = jax.tree.leaves(specs[name], is_leaf=lambda a: isinstance(a, P))
    assert tuple(spec) == LOGICAL_AXES[name]
  assert m.w1[...].shape == (6, 16, 48) and m.w2[...].shape == (6, 24, 16)
  assert m.w1[...].dtype == jnp.float32
  assert m(_x()).dtype == jnp.bfloat16


def test_nnx_training_step_reduces_loss():
  m = MoE(16, 32, 4, 2, rngs=nnx.Rngs(1), backend="xla", init_std=0.2)
  opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
  x = _x((64, 16))
  target = jnp.tanh(x[:, ::-1])

  @nnx.jit
  def step(m, opt):
    loss, g = nnx.value_and_grad(lambda m: jnp.mean((m(x) - target) ** 2))(m)
    opt.update(m, g)
    return loss

  losses = [float(step(m, opt)) for _ in range(30)]
  assert losses[-1] < 0.7 * losses[0]


def test_eval_mode_uses_topk_when_token_rounding():
  m = MoE(16, 8, 4, 2, rngs=nnx.Rngs(0), routing=sonic_jax.TokenRounding(tile=16),
          backend="xla")
  x = _x((40, 16))
  train_out = m(x)
  m.eval()
  eval_out = m(x)
  want = sonic_jax.moe(x, m.router[...], m.w1[...], m.w2[...], top_k=2, backend="xla")
  assert rel_err(eval_out, want) < 1e-6
  assert rel_err(train_out, want) > 1e-3  # rounding changed the routing in training


def test_linen_matches_nnx_math():
  mod = MoELinen(16, 24, 6, 2, aux_loss_coef=0.1, backend="xla")
  x = _x()
  variables = mod.init(jax.random.key(0), x)
  params = variables["params"]
  y, state = mod.apply(variables, x, mutable=["intermediates"])
  p = jax.tree.map(lambda a: a.unbox() if hasattr(a, "unbox") else a, params,
                   is_leaf=lambda a: hasattr(a, "unbox"))
  want = sonic_jax.moe(x.reshape(-1, 16), p["router"], p["w1"], p["w2"], top_k=2,
                       backend="xla").reshape(x.shape)
  assert rel_err(y, want) < 1e-6
  assert "aux_loss" in state["intermediates"]
  assert params["w1"].names == LOGICAL_AXES["w1"]
  g = jax.grad(lambda v: jnp.sum(mod.apply(v, x) ** 2))(variables)
  assert np.all(np.isfinite(np.asarray(g["params"]["w2"].unbox())))
