"""Bad input raises a ValueError naming the argument, before any compute."""

import jax.numpy as jnp
import pytest

import sonic_jax
from sonic_jax.nn import MoE
from tests.helpers import Problem, make_inputs

X, RW, W1, W2 = make_inputs(Problem(T=16, d=8, n=4, E=4, K=2))


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=X[0]), "x must have shape"),
    (dict(x=X.astype(jnp.int32)), "x must be floating"),
    (dict(router_w=RW[:4]), "router_w must have shape"),
    (dict(router_w=RW.astype(jnp.int32)), "router_w must be floating"),
    (dict(w1=W1[:3]), "w1.shape\\[0\\] must equal router_w.shape\\[1\\]"),
    (dict(w2=W2[:3]), "w1 and w2 must have num_experts"),
    (dict(w1=W1[..., :7]), "w1 must have shape"),
    (dict(w2=W2[:, :3]), "w2 must have shape"),
    (dict(w1=W1.astype(jnp.bfloat16)), "share a dtype"),
    (dict(top_k=0), "1 <= top_k <= num_experts"),
    (dict(top_k=5), "1 <= top_k <= num_experts"),
    (dict(top_k=2.0), "top_k must be an int"),
    (dict(routing="expert_choice"), "routing must be"),
    (dict(backend="cuda"), "backend must be"),
    (dict(routing_impl="cuda"), "routing_impl must be one of"),
])
def test_moe_rejects(kwargs, match):
  args = dict(x=X, router_w=RW, w1=W1, w2=W2, top_k=2)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sonic_jax.moe(**args)


def test_token_rounding_config_rejects():
  with pytest.raises(ValueError, match="TokenRounding.tile"):
    sonic_jax.TokenRounding(tile=0)
  with pytest.raises(ValueError, match="TokenRounding.mode"):
    sonic_jax.TokenRounding(mode="sideways")


def test_plan_token_mismatch():
  plan = sonic_jax.route(X, RW, top_k=2)
  with pytest.raises(ValueError, match="tokens but the plan routes"):
    sonic_jax.moe_experts(X[:8], plan, W1, W2)
  with pytest.raises(ValueError, match="plan must be a sonic_jax.RoutingPlan"):
    sonic_jax.moe_experts(X, {"scores": 1}, W1, W2)


def test_unavailable_backends_say_why():
  with pytest.raises(sonic_jax.BackendUnavailableError, match="Hopper|interpret"):
    sonic_jax.moe(X, RW, W1, W2, top_k=2, backend="pallas")
  with pytest.raises(sonic_jax.BackendUnavailableError, match="backend='ffi' is not available"):
    sonic_jax.moe(X, RW, W1, W2, top_k=2, backend="ffi")


def test_module_rejects_bad_config():
  import flax.nnx as nnx
  with pytest.raises(ValueError, match="top_k"):
    MoE(8, 4, 4, 5, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="d_ff"):
    MoE(8, 0, 4, 2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="routing_impl must be one of"):
    MoE(8, 4, 4, 2, rngs=nnx.Rngs(0), routing_impl="cuda")
  m = MoE(8, 4, 4, 2, rngs=nnx.Rngs(0), backend="xla")
  with pytest.raises(ValueError, match="last dimension d_model"):
    m(jnp.ones((3, 5)))
