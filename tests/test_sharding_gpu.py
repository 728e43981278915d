"""sonic_jax.sharding with the GPU kernels (pallas, ffi) inside shard_map, on the one H200.

The CPU suite (tests/test_sharding.py) checks the sharding logic on 8 host devices with the xla
kernels; these tests check that the Pallas and FFI kernels run inside ``jax.shard_map`` (which
runs with ``check_vma=False``; see sonic_jax/sharding.py) and that the native
``ragged_all_to_all`` lowers on a GPU mesh, against the unsharded layer with the same backend.
A one-device mesh exercises lowering and the exchange plumbing, not multi-GPU communication.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType

import sonic_jax
from sonic_jax.sharding import MoESharding, sharded_moe
from tests.helpers import Problem, make_inputs, rel_err, value_and_grads

pytestmark = pytest.mark.gpu

PROB = Problem(T=2048, d=512, n=256, E=16, K=4)
# The dense expert exchange is the same code with a plain all_to_all (tested on CPU devices).
MODES = {
    "data": dict(),
    "expert_ragged": dict(expert_axis="expert", exchange="ragged"),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("backend", ["pallas", "ffi"])
def test_sharded_gpu_backend_matches_unsharded(backend, mode):
  if backend not in sonic_jax.available_backends():
    pytest.skip(f"backend {backend!r} is not available here")
  mesh = jax.make_mesh((1, 1), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)
  cfg = MoESharding(mesh, **MODES[mode])
  args = make_inputs(PROB, jnp.bfloat16)
  ct = jax.random.normal(jax.random.key(3), (PROB.T, PROB.d), jnp.bfloat16)
  want = value_and_grads(
      lambda *a: sonic_jax.moe(*a, top_k=PROB.K, backend=backend), args, ct)
  got = value_and_grads(
      lambda *a: sharded_moe(*a, sharding=cfg, top_k=PROB.K, backend=backend), args, ct)
  names = ("out", "dx", "drouter", "dw1", "dw2")
  for name, g, w in zip(names, jax.tree.leaves(got), jax.tree.leaves(want)):
    assert rel_err(g, w) < 2e-2, (name, rel_err(g, w))
