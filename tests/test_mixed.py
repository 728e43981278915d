"""MixedKernels: each entry point from the backend named for it (CPU; GPU mixes in test_ffi)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import sonic_jax
from sonic_jax.bench.variants import kernels_for
from sonic_jax.mixed import ENTRY_POINTS, MixedKernels
from sonic_jax.xla_backend import XlaKernels
from tests.helpers import Problem, make_inputs, rel_err


class _Recording(XlaKernels):
  """The xla kernels, recording which entry points were traced on this instance."""

  def __init__(self, tag: str, calls: list):
    self.tag, self.calls = tag, calls

  def __hash__(self):
    return hash(self.tag)

  def __eq__(self, other):
    return isinstance(other, _Recording) and other.tag == self.tag

  def __getattribute__(self, name):
    if name in ENTRY_POINTS:
      object.__getattribute__(self, "calls").append((object.__getattribute__(self, "tag"), name))
    return object.__getattribute__(self, name)


def _problem(t=48, d=64, n=32, e=6, k=2, dtype=jnp.float32, seed=7):
  """((x, router_w, w1, w2), cotangent, top_k) of a random layer (tests.helpers.make_inputs)."""
  args = make_inputs(Problem(T=t, d=d, n=n, E=e, K=k, seed=seed), dtype)
  ct = jax.random.normal(jax.random.key(seed + 1), (t, d), jnp.float32)
  return args, ct, k


def _grads(backend, args, ct, k):
  def f(*a):
    return jnp.sum(sonic_jax.moe(*a, top_k=k, backend=backend) * ct)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(*args)


def test_each_entry_point_runs_on_its_backend():
  calls = []
  base, other = _Recording("base", calls), _Recording("other", calls)
  mixed = MixedKernels(base, dh=other, dx_pairs=other, combine=other)
  args, ct, k = _problem()
  _grads(mixed, args, ct, k)
  by = {}
  for tag, name in calls:
    by.setdefault(name, set()).add(tag)
  assert by == {"up_proj": {"base"}, "down_proj": {"base"}, "combine": {"other"},
                "dh": {"other"}, "dw2": {"base"}, "dx_pairs": {"other"}, "dw1": {"base"}}


def test_mixed_gradients_match_the_base_backend():
  args, ct, k = _problem()
  want_v, want_g = _grads("xla", args, ct, k)
  calls = []
  mixed = MixedKernels(XlaKernels(), up_proj=_Recording("o", calls), dw1=_Recording("o", calls))
  got_v, got_g = _grads(mixed, args, ct, k)
  assert rel_err(got_v, want_v) < 1e-6
  for name, g, w in zip(("dx", "drouter_w", "dw1", "dw2"), got_g, want_g):
    assert rel_err(g, w) < 1e-6, name


def test_mixed_with_pallas_interpret_matches_xla():
  """The xla forward with the Pallas (Mosaic GPU interpreter) dx_pairs and combine."""
  from sonic_jax.pallas.backend import PallasKernels
  args, ct, k = _problem(t=64, d=128, n=64, e=5, k=2, dtype=jnp.bfloat16, seed=3)
  pallas = PallasKernels(interpret=True, backward_gathers="xla")
  mixed = MixedKernels(XlaKernels(), dx_pairs=pallas, combine=pallas)
  got_v, got_g = _grads(mixed, args, ct, k)
  want_v, want_g = _grads("xla", args, ct, k)
  assert rel_err(got_v, want_v) < 2e-2
  for name, g, w in zip(("dx", "drouter_w", "dw1", "dw2"), got_g, want_g):
    assert rel_err(g, w) < 2e-2, name


def test_value_semantics_and_flattening():
  a = MixedKernels(XlaKernels(), dh=_Recording("o", []))
  b = MixedKernels(XlaKernels(), dh=_Recording("o", []))
  assert a == b and hash(a) == hash(b)
  # An override equal to the base is the base; a mixed base is flattened.
  assert MixedKernels(XlaKernels(), dh=XlaKernels()).overrides == {}
  nested = MixedKernels(a, dw1=_Recording("p", []))
  assert nested.base == XlaKernels() and set(nested.overrides) == {"dh", "dw1"}
  assert nested.backend_of("dw1").tag == "p" and nested.backend_of("up_proj") == XlaKernels()
  assert nested.dw1_last == XlaKernels().dw1_last
  # XlaKernels instances are one backend; a subclass (which may hold state) is itself only, so
  # the custom_vjp block cached for one instance is never reused for another.
  class Sub(XlaKernels):
    pass
  assert XlaKernels() == XlaKernels() and Sub() != Sub() and Sub() != XlaKernels()
  s = Sub()
  assert s == s and len({Sub(), Sub(), XlaKernels(), XlaKernels()}) == 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(base="xla"), "base must be an ExpertKernels"),
    (dict(base=XlaKernels(), dgate=XlaKernels()), "unknown entry point 'dgate'"),
    (dict(base=XlaKernels(), dh="ffi"), "dh must be a"),
])
def test_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    MixedKernels(**kwargs)


def test_validate_runs_every_backend():
  seen = []

  class _Strict(XlaKernels):
    def __init__(self, tag):
      self.tag = tag

    def __eq__(self, other):
      return isinstance(other, _Strict) and other.tag == self.tag

    def __hash__(self):
      return hash(self.tag)

    def validate(self, x, plan, w1, w2):
      seen.append(self.tag)
      if self.tag == "picky":
        raise ValueError("w1: picky backend rejects this shape")

  args, _, k = _problem()
  with pytest.raises(ValueError, match="picky backend"):
    sonic_jax.moe(*args, top_k=k, backend=MixedKernels(_Strict("ok"), dw2=_Strict("picky")))
  assert seen == ["ok", "picky"]


def test_validate_checks_only_the_entry_points_each_backend_runs():
  """pallas' dh cannot tile n = 160 (its forward can): a mix whose dh, dW1 and dW2 run on ffi
  (whose checks pass without its library) accepts the shape, one that keeps pallas' dh rejects
  it naming dh, and pallas alone rejects it; each backend is told its own entry points."""
  from sonic_jax.ffi.backend import FfiKernels
  from sonic_jax.pallas.backend import PallasKernels
  p = Problem(T=64, d=768, n=160, E=4, K=2)
  x, rw, w1, w2 = (a.astype(jnp.bfloat16) for a in make_inputs(p))
  plan = sonic_jax.route(x, rw, top_k=p.K)
  pallas, ffi = PallasKernels(), FfiKernels()
  with pytest.raises(ValueError, match="backward kernel dh"):
    pallas.validate(x, plan, w1, w2)
  pallas.validate(x, plan, w1, w2, backward=False)
  MixedKernels(pallas, dh=ffi, dw2=ffi, dx_pairs=ffi, dw1=ffi).validate(x, plan, w1, w2)
  with pytest.raises(ValueError, match="backward kernel dh"):
    MixedKernels(pallas, dw2=ffi, dx_pairs=ffi, dw1=ffi).validate(x, plan, w1, w2)

  told = []

  class _Told(XlaKernels):
    def validate_entries(self, x, plan, w1, w2, entries):
      told.append(tuple(entries))

  MixedKernels(_Told(), dh=ffi, dw1=ffi).validate(x, plan, w1, w2)
  assert told == [("up_proj", "down_proj", "combine", "dw2", "dx_pairs")]


@pytest.mark.parametrize("d, n", [(128, 160), (256, 96)])
def test_pallas_forward_where_its_dh_cannot_tile(d, n):
  """What the per-entry validation lets through: pallas' forward and dx_pairs (interpreter) at an
  n its dh cannot tile, the other backward kernels on xla; gradients against xla."""
  from sonic_jax.pallas.backend import PallasKernels
  p = Problem(T=48, d=d, n=n, E=5, K=2)
  x, rw, w1, w2 = (a.astype(jnp.bfloat16) for a in make_inputs(p))
  xla = XlaKernels()
  mix = MixedKernels(PallasKernels(interpret=True), dh=xla, dw1=xla, dw2=xla)

  def loss(x, w1, w2, backend):
    out = sonic_jax.moe(x, rw, w1, w2, top_k=p.K, backend=backend)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  got = jax.grad(loss, argnums=(0, 1, 2))(x, w1, w2, mix)
  want = jax.grad(loss, argnums=(0, 1, 2))(x, w1, w2, "xla")
  for g, w in zip(got, want):
    assert rel_err(g, w) < 1e-2 and bool(jnp.all(jnp.isfinite(g)))


def test_variant_spec():
  from sonic_jax.pallas.backend import PallasKernels
  kern = kernels_for("pallas+dx_pairs/dw1=pallas:xla")
  assert isinstance(kern, MixedKernels) and kern.base == PallasKernels()
  assert kern.backend_of("dw1") == PallasKernels(backward_gathers="xla")
  assert kern.backend_of("dh") == PallasKernels()
  with pytest.raises(SystemExit, match="entries from"):
    kernels_for("pallas+dgate=xla")
  with pytest.raises(SystemExit, match="entries from"):
    kernels_for("pallas+dh")
