"""sonic_jax.sharding on 8 host CPU devices (tests/conftest.py sets the XLA flag).

Every mode is checked against the unsharded ``sonic_jax.moe`` (backend="xla"): the output and
the gradients of x, router, w1 and w2 separately, plus the layouts the docs promise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import sonic_jax
import sonic_jax.xla_backend
from sonic_jax import reference
from sonic_jax.sharding import (MoESharding, expert_parallel_capacity, expert_parallel_dropped,
                                sharded_moe)
from tests.helpers import Problem, make_inputs, rel_err, value_and_grads

K = 2
PROB = Problem(T=64, d=32, n=16, E=12, K=K)  # E/X = 3 or 6 local experts: not powers of 2

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")


def _mesh(sizes: dict[str, int], explicit: bool = False):
  kind = AxisType.Explicit if explicit else AxisType.Auto
  return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(kind,) * len(sizes))


@functools.partial(jax.jit, static_argnames=("routing",))
def _moe_vjp(args, ct, routing="topk"):
  """Unsharded layer: output and gradients (one compile per shape, shared by the tests)."""
  out, vjp = jax.vjp(lambda *a: sonic_jax.moe(*a, top_k=K, routing=routing, backend="xla"),
                     *args)
  return out, vjp(ct)


@functools.cache
def _unsharded_reference():
  """Inputs, cotangent, output and gradients of the unsharded layer (shared by the modes)."""
  args = make_inputs(PROB)
  ct = jax.random.normal(jax.random.key(7), (PROB.T, PROB.d), jnp.float32)
  return (args, ct, *_moe_vjp(args, ct))


def _aux_loss(x, router_w):
  logits = sonic_jax.router_logits(x, router_w)
  return sonic_jax.load_balancing_loss(logits, sonic_jax.route_logits(logits, top_k=K))


@functools.cache
def _unsharded_aux_reference():
  """Global load-balancing loss and its gradients (x, router) for the mode tests' inputs."""
  args = _unsharded_reference()[0]
  return jax.jit(jax.value_and_grad(_aux_loss, argnums=(0, 1)))(args[0], args[1])


def _check(out, grads, ref_out, ref_grads, tol):
  assert rel_err(out, ref_out) < tol, ("out", rel_err(out, ref_out))
  for name, g, r in zip(("dx", "drouter", "dw1", "dw2"), grads, ref_grads):
    assert rel_err(g, r) < tol, (name, rel_err(g, r))


def _opaque(a):
  """Identity through a pallas_call (interpret mode) whose out_shape declares no varying mesh
  axes, as the Pallas and FFI kernels do: to shard_map such a result is an opaque custom call."""
  if a is None:
    return None

  def copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  return pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
                        interpret=True)(a)


class _OpaqueKernels(sonic_jax.xla_backend.XlaKernels):
  """The xla kernels with every output made opaque (a stand-in for the GPU backends), recording
  the shapes each up_proj call sees (at trace time)."""

  name = "opaque"

  def __init__(self):
    self.seen = []

  def up_proj(self, x, w1, plan, **kw):
    self.seen.append((x.shape, w1.shape))
    return tuple(map(_opaque, super().up_proj(x, w1, plan, **kw)))

  def down_proj(self, *a, **kw):
    return _opaque(super().down_proj(*a, **kw))

  def combine(self, *a, **kw):
    return _opaque(super().combine(*a, **kw))

  def dh(self, *a, **kw):
    return tuple(map(_opaque, super().dh(*a, **kw)))

  def dw2(self, *a, **kw):
    return _opaque(super().dw2(*a, **kw))

  def dx_pairs(self, *a, **kw):
    return _opaque(super().dx_pairs(*a, **kw))

  def dw1(self, *a, **kw):
    return _opaque(super().dw1(*a, **kw))


MODES = {
    "data": (dict(data=8), dict()),
    "fsdp": (dict(fsdp=8), dict(data_axis=None, fsdp_axis="fsdp")),
    "expert": (dict(data=2, expert=4), dict(expert_axis="expert")),
    "data_fsdp_expert": (dict(data=2, fsdp=2, expert=2),
                         dict(fsdp_axis="fsdp", expert_axis="expert")),
    "expert_ragged": (dict(data=2, expert=4), dict(expert_axis="expert", exchange="ragged")),
    "data_fsdp_expert_ragged": (dict(data=2, fsdp=2, expert=2),
                                dict(fsdp_axis="fsdp", expert_axis="expert",
                                     exchange="ragged")),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_matches_unsharded(mode):
  sizes, kw = MODES[mode]
  cfg = MoESharding(_mesh(sizes), **kw)
  args, ct, ref_out, ref_grads = _unsharded_reference()
  kernels = _OpaqueKernels()  # a backend instance passes through like "pallas" / "ffi"

  @jax.jit
  def run(args):
    (out, aux), vjp = jax.vjp(
        lambda *a: sharded_moe(*a, sharding=cfg, top_k=K, backend=kernels, return_aux_loss=True),
        *args)
    grads = vjp((ct, jnp.zeros_like(aux)))
    aux_grads = vjp((jnp.zeros_like(out), jnp.ones_like(aux)))
    return out, aux, grads, aux_grads

  out, aux, grads, aux_grads = run(args)
  _check(out, grads, ref_out, ref_grads, 1e-5)
  # The kernels ran on local shapes: T/N tokens (X·C received rows with an expert axis), the
  # device's E/X experts, the full (gathered) d.
  x_size = cfg.num_expert_shards
  t_local = PROB.T // cfg.num_token_shards
  rows = t_local if cfg.expert_axis is None else x_size * expert_parallel_capacity(
      t_local, PROB.E, K, x_size)
  assert set(kernels.seen) == {((rows, PROB.d), (PROB.E // x_size, PROB.d, 2 * PROB.n))}
  # Layouts: tokens over (data..., fsdp, expert); gradients laid out like their parameters.
  assert out.sharding.is_equivalent_to(NamedSharding(cfg.mesh, cfg.token_spec), 2)
  for g, spec in zip(grads, (cfg.token_spec, cfg.router_spec, cfg.w1_spec, cfg.w2_spec)):
    assert g.sharding.is_equivalent_to(NamedSharding(cfg.mesh, spec), g.ndim), (
        g.sharding, spec)
  # The aux loss is the global one, and so are its gradients.
  want, want_grads = _unsharded_aux_reference()
  assert abs(float(aux) - float(want)) < 1e-5 * abs(float(want))
  for name, g, r in zip(("dx", "drouter"), aux_grads, want_grads):
    assert rel_err(g, r) < 1e-5, ("aux " + name, rel_err(g, r))


def test_explicit_mesh_and_spec_table():
  mesh = _mesh(dict(data=2, fsdp=2, expert=2), explicit=True)
  cfg = MoESharding(mesh, fsdp_axis="fsdp", expert_axis="expert")
  assert cfg.token_spec == P(("data", "fsdp", "expert"), None)
  assert cfg.router_spec == P("fsdp", "expert")
  assert cfg.w1_spec == P("expert", "fsdp", None)
  assert cfg.w2_spec == P("expert", None, "fsdp")
  args = make_inputs(PROB)
  placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in
            zip(args, (cfg.token_spec, cfg.router_spec, cfg.w1_spec, cfg.w2_spec))]
  out = jax.jit(lambda *a: sharded_moe(*a, sharding=cfg, top_k=K, backend="xla"))(*placed)
  assert out.sharding.spec == cfg.token_spec
  assert rel_err(out, sonic_jax.moe(*args, top_k=K, backend="xla")) < 1e-5


def test_logical_axis_rules_match_nn_module():
  from flax import linen
  from sonic_jax.nn import LOGICAL_AXES
  cfg = MoESharding(_mesh(dict(data=2, fsdp=2, expert=2)), fsdp_axis="fsdp",
                    expert_axis="expert")
  specs = cfg.param_specs()
  for name, axes in LOGICAL_AXES.items():
    assert linen.logical_to_mesh_axes(axes, cfg.logical_axis_rules) == specs[name], name


def test_token_rounding_per_shard():
  rounding = sonic_jax.TokenRounding(tile=4, mode="nearest")
  # "rep" is not named: tokens split 4 ways over "expert", work is repeated over "rep".
  cfg = MoESharding(_mesh(dict(rep=2, expert=4)), data_axis=None, expert_axis="expert")
  args = make_inputs(PROB)
  ct = jax.random.normal(jax.random.key(3), (PROB.T, PROB.d), jnp.float32)
  shards = cfg.num_token_shards
  assert shards == 4
  # Rounding must matter here, or the test could not tell per-shard from global top-K.
  local = sonic_jax.route(args[0][:PROB.T // shards], args[1], top_k=K, routing=rounding)
  assert int(local.num_pairs) != (PROB.T // shards) * K
  # Reference: the unsharded layer on each token shard separately.
  t_local = PROB.T // shards
  per_shard = [_moe_vjp((args[0][i * t_local:(i + 1) * t_local], *args[1:]),
                        ct[i * t_local:(i + 1) * t_local], routing=rounding)
               for i in range(shards)]
  ref_out = jnp.concatenate([o for o, _ in per_shard])
  ref_grads = (jnp.concatenate([g[0] for _, g in per_shard]),
               *(sum(g[i] for _, g in per_shard) for i in (1, 2, 3)))
  out, grads = value_and_grads(
      lambda *a: sharded_moe(*a, sharding=cfg, top_k=K, routing=rounding, backend="xla"),
      args, ct)
  _check(out, grads, ref_out, ref_grads, 1e-5)
  assert rel_err(ref_out, sonic_jax.moe(*args, top_k=K, backend="xla")) > 1e-3


@pytest.mark.parametrize("exchange", ["dense", "ragged"])
def test_hot_expert_expert_parallel(exchange):
  """Every token's first choice is expert 0: device 0 of the expert axis gets all tokens."""
  prob = Problem(T=64, d=32, n=16, E=8, K=K, skew="one")
  args = make_inputs(prob)
  cfg = MoESharding(_mesh(dict(expert=8)), data_axis=None, expert_axis="expert",
                    exchange=exchange)
  plan = sonic_jax.route(args[0], args[1], top_k=K)
  assert int(plan.group_sizes[0]) == prob.T
  ct = jax.random.normal(jax.random.key(5), (prob.T, prob.d), jnp.float32)
  ref_out, ref_grads = _moe_vjp(args, ct)
  out, grads = value_and_grads(
      lambda *a: sharded_moe(*a, sharding=cfg, top_k=K, backend="xla"), args, ct)
  _check(out, grads, ref_out, ref_grads, 1e-5)


@pytest.mark.parametrize("exchange", ["dense", "ragged"])
def test_capacity_overflow_drops_late_pairs(exchange):
  """capacity_factor=1 with a hot expert: pairs past C per (sender, receiver) are dropped."""
  prob = Problem(T=64, d=32, n=16, E=8, K=K, seed=1)
  x, rw, w1, w2 = make_inputs(prob)
  # Experts 0 and 1 (both on expert-axis device 0) are every token's two choices, ~1/2 each.
  x = x.at[:, 0].set(jnp.abs(x[:, 0]) + 1.0)
  rw = rw.at[0, 0].set(50.0).at[0, 1].set(50.0)
  sizes = dict(data=2, expert=4)
  cfg = MoESharding(_mesh(sizes), expert_axis="expert", capacity_factor=1.0,
                    exchange=exchange)
  shards, x_size = cfg.num_token_shards, sizes["expert"]
  t_local, e_local = prob.T // shards, prob.E // x_size
  cap = expert_parallel_capacity(t_local, prob.E, K, x_size, capacity_factor=1.0)
  assert cap == 8 and cap < t_local * K
  # Reference: per token shard, keep the first `cap` pairs (expert-major, then token order)
  # bound for each receiving device.
  gates = np.zeros((prob.T, prob.E), np.float32)
  dropped = 0
  for i in range(shards):
    plan = sonic_jax.route(x[i * t_local:(i + 1) * t_local], rw, top_k=K)
    tok, exp, sc = (np.asarray(a) for a in (plan.token_ids, plan.expert_ids, plan.scores))
    order = np.lexsort((tok, exp))  # grouped order
    sent = np.zeros(x_size, int)
    for j in order:
      dest = exp[j] // e_local
      if sent[dest] < cap:
        gates[i * t_local + tok[j], exp[j]] = sc[j]
      else:
        dropped += 1
      sent[dest] += 1
  assert dropped == shards * (t_local * K - cap)
  want = reference.dense_experts(x, jnp.asarray(gates), w1, w2)
  out = jax.jit(lambda *a: sharded_moe(*a, sharding=cfg, top_k=K, backend="xla"))(x, rw, w1, w2)
  assert rel_err(out, want) < 1e-5
  assert rel_err(out, sonic_jax.moe(x, rw, w1, w2, top_k=K, backend="xla")) > 1e-2
  assert int(jax.jit(lambda x, rw: expert_parallel_dropped(x, rw, sharding=cfg, top_k=K))(
      x, rw)) == dropped
  dropless = MoESharding(cfg.mesh, expert_axis="expert")
  assert int(expert_parallel_dropped(x, rw, sharding=dropless, top_k=K)) == 0


def test_ragged_all_to_all_emulation_follows_jax_semantics():
  """The CPU stand-in for ragged_all_to_all on the example of jax.lax.ragged_all_to_all's
  docstring: each sender names where its slices land on the receivers."""
  from sonic_jax.sharding import _ragged_all_to_all
  mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
  operand = jnp.array([[1, 2, 2], [3, 4, 0]], jnp.float32)
  output = jnp.zeros((2, 4), jnp.float32)
  in_off = jnp.array([[0, 1], [0, 1]], jnp.int32)
  send = jnp.array([[1, 2], [1, 1]], jnp.int32)
  out_off = jnp.array([[0, 0], [1, 2]], jnp.int32)
  recv = jnp.array([[1, 1], [2, 1]], jnp.int32)
  fn = jax.shard_map(
      lambda *a: _ragged_all_to_all(*(b[0] for b in a), axis="x", max_size=2,
                                    native=False)[None],
      mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x"), check_vma=False)
  got = jax.jit(fn)(operand, output, in_off, send, out_off, recv)
  np.testing.assert_array_equal(np.asarray(got), [[1, 3, 0, 0], [2, 2, 4, 0]])


def test_sharded_module_matches_nn_moe():
  from flax import nnx
  from sonic_jax.nn import MoE
  from sonic_jax.sharding import place_params, shard_moe_layers
  cfg = MoESharding(_mesh(dict(data=2, fsdp=2, expert=2)), fsdp_axis="fsdp",
                    expert_axis="expert")
  x = jax.random.normal(jax.random.key(1), (4, 16, 32), jnp.float32)
  # bf16 compute (f32 params), as on GPUs.
  moe = MoE(32, 16, 8, K, rngs=nnx.Rngs(0), backend="xla", aux_loss_coef=0.1, init_std=0.2,
            dtype=jnp.bfloat16)
  sharded = nnx.clone(moe)
  assert shard_moe_layers(sharded, cfg) == 1 and sharded.sharding is cfg
  place_params(sharded, cfg)
  assert sharded.w1[...].sharding.spec == cfg.w1_spec
  assert sharded.router[...].sharding.spec == cfg.router_spec

  def loss(m, x):
    out, aux = m(x, return_aux_loss=True)
    return jnp.sum(out * jnp.cos(x)) + aux, (out, aux)

  @nnx.jit
  def step(m, x):
    return nnx.grad(loss, has_aux=True)(m, x)

  g_ref, (o_ref, a_ref) = step(moe, x)
  g, (o, a) = step(sharded, x)
  assert o.shape == x.shape and o.dtype == jnp.bfloat16
  assert rel_err(o, o_ref) < 1e-2
  assert abs(float(a) - float(a_ref)) < 1e-2 * abs(float(a_ref))
  for name in ("router", "w1", "w2"):
    assert rel_err(g[name][...], g_ref[name][...]) < 2e-2, name


def test_sharded_linen_module_matches_moe_linen():
  from sonic_jax.nn import MoELinen
  # Two data axes (a tuple) and an expert axis.
  cfg = MoESharding(_mesh(dict(pod=2, data=2, expert=2)), data_axis=("pod", "data"),
                    expert_axis="expert")
  assert cfg.token_spec == P(("pod", "data", "expert"), None)
  x = jax.random.normal(jax.random.key(2), (4, 16, 32), jnp.float32)
  kw = dict(d_model=32, d_ff=16, num_experts=8, top_k=K, backend="xla", aux_loss_coef=0.1,
            init_std=0.2)
  ref, mod = MoELinen(**kw), MoELinen(**kw, sharding=cfg)
  params = ref.init(jax.random.key(0), x)
  assert (jax.tree.structure(params)
          == jax.tree.structure(jax.eval_shape(mod.init, jax.random.key(0), x)))

  def run(module):
    def loss(p):
      out, aux = module.apply(p, x, return_aux_loss=True)
      return jnp.sum(out * jnp.cos(x)) + aux, out
    return jax.jit(jax.grad(loss, has_aux=True))(params)

  (g_ref, o_ref), (g, o) = run(ref), run(mod)
  assert rel_err(o, o_ref) < 1e-5
  for name in ("router", "w1", "w2"):
    a, b = (linen_unbox(t["params"][name]) for t in (g, g_ref))
    assert rel_err(a, b) < 1e-5, name
  with pytest.raises(ValueError, match="sharding must be None or a sonic_jax.sharding"):
    MoELinen(**kw, sharding="expert").init(jax.random.key(0), x)


def linen_unbox(v):
  return v.unbox() if hasattr(v, "unbox") else v


def _bad(cfg_kw=None, sizes=None, **shape_kw):
  sizes = sizes or dict(data=2, expert=4)
  cfg = MoESharding(_mesh(sizes), **(cfg_kw or dict(expert_axis="expert")))
  p = {**dict(T=64, d=32, n=16, E=8), **shape_kw}
  # Shapes are all validation looks at: numpy zeros, nothing is computed.
  args = (np.zeros((p["T"], p["d"]), np.float32), np.zeros((p["d"], p["E"]), np.float32),
          np.zeros((p["E"], p["d"], 2 * p["n"]), np.float32),
          np.zeros((p["E"], p["n"], p["d"]), np.float32))
  sharded_moe(*args, sharding=cfg, top_k=K, backend="xla")


@pytest.mark.parametrize("make,match", [
    (lambda: MoESharding(_mesh(dict(data=8)), expert_axis="experts"),
     "unknown mesh axis 'experts'"),
    (lambda: MoESharding(_mesh(dict(data=8)), data_axis="batch"), "unknown mesh axis 'batch'"),
    (lambda: MoESharding(_mesh(dict(data=8)), fsdp_axis="data"), "distinct mesh axes"),
    (lambda: MoESharding(_mesh(dict(data=8)), data_axis=None), "at least one"),
    (lambda: MoESharding(_mesh(dict(data=8)), capacity_factor=0.0), "capacity_factor"),
    (lambda: MoESharding(_mesh(dict(data=8)), exchange="sparse"), "exchange must be"),
    (lambda: MoESharding("mesh"), "jax.sharding.Mesh"),
    (lambda: _bad(E=6), r"E = 6 must be divisible by the size 4 of expert_axis"),
    (lambda: _bad(T=60), r"T = 60 .* divisible by the number of token shards 8"),
    (lambda: _bad(dict(fsdp_axis="fsdp", data_axis=None), dict(fsdp=8), d=36),
     r"d_model = 36 must be divisible by the size 8 of fsdp_axis"),
    (lambda: sharded_moe(*_unsharded_reference()[0], sharding=None, top_k=K), "MoESharding"),
    (lambda: sharded_moe(*_unsharded_reference()[0], sharding=MoESharding(_mesh(dict(data=8))),
                         top_k=K, routing_impl="cuda"), "routing_impl must be one of"),
])
def test_bad_input_raises(make, match):
  with pytest.raises(ValueError, match=match):
    make()
