"""backend="auto": which backend a call runs on (per shape, availability and validate rules).

The GPU backends are replaced by recording stand-ins (the xla kernels under another name, with
their own validate rule), so the selection itself is tested on the CPU.
"""

import warnings

import jax
import jax.numpy as jnp
import pytest

import sonic_jax
from sonic_jax import backends
from sonic_jax.mixed import ENTRY_POINTS
from sonic_jax.reference import moe_reference
from sonic_jax.xla_backend import XlaKernels
from tests.helpers import Problem, make_inputs, rel_err


class _StandIn(XlaKernels):
  """xla's kernels under a GPU backend's name; records the calls it served; rejects float32
  operands as the GPU backends do."""

  def __init__(self, name: str, calls: list, **options):
    self.name = name
    self._calls = calls
    self.options = options  # what a COMBINED part passes to the kernels class

  def validate(self, x, plan, w1, w2):
    if x.dtype == jnp.float32:
      raise ValueError(f"x must be bfloat16 for backend={self.name!r}, got float32")

  def up_proj(self, x, w1, plan, *, inference=False):
    self._calls.append(self.name)
    return super().up_proj(x, w1, plan, inference=inference)


@pytest.fixture
def fake_gpu(monkeypatch):
  """Makes "pallas" and "ffi" (or only those listed in the returned setter) available."""
  calls: list[str] = []

  def unavailable(name):
    def load(**_):
      raise backends.BackendUnavailableError(f"backend={name!r} is not available: test")
    return load

  def install(*names: str):
    loaders = dict(backends._LOADERS)
    for name in ("pallas", "ffi"):
      loaders[name] = ((lambda n=name, **opts: _StandIn(n, calls, **opts)) if name in names
                       else unavailable(name))
    monkeypatch.setattr(backends, "_LOADERS", loaders)
    backends._resolve_name.cache_clear()
    return calls

  yield install
  backends._resolve_name.cache_clear()


@pytest.mark.parametrize("d, n, first", [
    (768, 256, "pallas+ffi"), (768, 1024, "ffi"), (1536, 256, "pallas+ffi"), (1536, 512, "ffi"),
    (4096, 256, "pallas+ffi"), (4096, 512, "ffi"), (7168, 2048, "ffi"), (64, 4096, "ffi"),
    (4096, 257, "pallas"), (4096, 511, "pallas"), (64, 8, "pallas+ffi"), (None, 1024, "pallas"),
    (4096, None, "pallas")])
def test_auto_order_rule(d, n, first):
  order = sonic_jax.auto_order(d, n)
  assert order[0] == first
  assert set(order) - set(sonic_jax.BACKENDS) <= set(sonic_jax.COMBINED)
  assert set(sonic_jax.BACKENDS) <= set(order) and order[-1] == "xla"


@pytest.mark.parametrize("available, d, n, want", [
    (("pallas", "ffi"), 4096, 1024, "ffi"), (("pallas", "ffi"), 768, 256, "pallas+ffi"),
    (("pallas", "ffi"), 768, 384, "pallas"),
    (("pallas",), 4096, 1024, "pallas"), (("pallas",), 768, 256, "pallas"),
    (("ffi",), 768, 256, "ffi"), ((), 4096, 1024, "xla"), ((), 768, 256, "xla"),
    (("pallas", "ffi"), None, None, "pallas")])
def test_resolve_auto_by_shape(fake_gpu, available, d, n, want):
  fake_gpu(*available)
  assert sonic_jax.resolve_backend("auto", d=d, n=n).name == want
  assert sonic_jax.available_backends() == [b for b in sonic_jax.BACKENDS
                                            if b == "xla" or b in available]


def test_pallas_ffi_is_the_pallas_forward_with_the_ffi_backward(fake_gpu):
  """The combination auto picks at n <= 256: a MixedKernels whose forward entry points are
  pallas' and whose backward GEMMs are ffi's; nameable; unavailable (saying which part) where
  either backend is; rejected names list it."""
  fake_gpu("pallas", "ffi")
  kern = sonic_jax.resolve_backend("pallas+ffi")
  assert kern.name == "pallas+ffi" and kern is sonic_jax.resolve_backend("auto", d=64, n=32)
  got = {e: kern.backend_of(e).name for e in ENTRY_POINTS}
  assert got == {"up_proj": "pallas", "down_proj": "pallas", "combine": "pallas",
                 "dh": "ffi", "dw2": "ffi", "dx_pairs": "ffi", "dw1": "ffi"}
  assert "name='pallas+ffi'" in repr(kern)
  fake_gpu("pallas")
  with pytest.raises(sonic_jax.BackendUnavailableError,
                     match=r"backend='pallas\+ffi' is not available: backend='ffi'"):
    sonic_jax.resolve_backend("pallas+ffi")
  with pytest.raises(ValueError, match=r"one of \('xla', 'pallas', 'ffi', 'pallas\+ffi', "):
    sonic_jax.resolve_backend("ffi+pallas")


def test_pallas_ffi_wgrad_entry_points_and_options(fake_gpu):
  """"pallas+ffi-wgrad": pallas' forward and dh, ffi's dx_pairs, dW1 and dW2 on one FfiKernels
  that reads x / dO through the gather index for both weight gradients (its "auto" would scatter
  them at n > 256, assuming ffi's own forward); a different instance from plain "ffi"; opt-in
  (auto never picks it); unavailable, saying which part, where either backend is."""
  fake_gpu("pallas", "ffi")
  kern = sonic_jax.resolve_backend("pallas+ffi-wgrad")
  assert kern.name == "pallas+ffi-wgrad"
  got = {e: kern.backend_of(e).name for e in ENTRY_POINTS}
  assert got == {"up_proj": "pallas", "down_proj": "pallas", "combine": "pallas",
                 "dh": "pallas", "dw2": "ffi", "dx_pairs": "ffi", "dw1": "ffi"}
  ffi = kern.backend_of("dw1")
  assert ffi.options == {"wgrad_gather": "both"}
  assert kern.backend_of("dw2") is ffi and kern.backend_of("dx_pairs") is ffi
  assert sonic_jax.resolve_backend("ffi") is not ffi
  assert sonic_jax.resolve_backend("ffi").options == {}
  assert kern.backend_of("up_proj") is sonic_jax.resolve_backend("pallas")
  for d, n in ((768, 256), (4096, 512), (7168, 2048), (None, None)):
    assert "pallas+ffi-wgrad" not in sonic_jax.auto_order(d, n)
  fake_gpu("ffi")
  with pytest.raises(sonic_jax.BackendUnavailableError,
                     match=r"backend='pallas\+ffi-wgrad' is not available: backend='pallas'"):
    sonic_jax.resolve_backend("pallas+ffi-wgrad")


def test_combined_parts_options_are_valid_for_their_kernels_class():
  """Every COMBINED part with options builds its kernels class with them (no GPU needed to
  construct PallasKernels / FfiKernels), so a misspelt option fails here, not on a GPU."""
  from sonic_jax.ffi.backend import FfiKernels
  from sonic_jax.pallas.backend import PallasKernels
  classes = {"pallas": PallasKernels, "ffi": FfiKernels}
  parts = {part for base, entries in sonic_jax.COMBINED.values()
           for part in (base, *entries.values()) if not isinstance(part, str)}
  assert parts, "no COMBINED part carries options"
  for name, options in parts:
    kern = classes[name](**dict(options))
    for key, value in options:
      assert getattr(kern, key) == value


@pytest.mark.parametrize("backend, runs", [("auto", "pallas+ffi"),
                                           ("pallas+ffi-wgrad", "pallas+ffi-wgrad")])
def test_training_step_on_a_combined_backend(fake_gpu, backend, runs):
  """With both backends, a training step under auto (at n <= 256: "pallas+ffi") or named
  "pallas+ffi-wgrad" runs pallas' up_proj (the recording stand-ins log only up_proj), matches
  the reference, and passes nothing over."""
  calls = fake_gpu("pallas", "ffi")
  p = Problem(T=32, d=64, n=32, E=4, K=2)
  x, rw, w1, w2, plan = _call(p, jnp.bfloat16)
  assert sonic_jax.select_backend(backend, x, plan, w1, w2).name == runs

  def loss(x, w1, w2, backend):
    return jnp.sum(sonic_jax.moe(x, rw, w1, w2, top_k=p.K, backend=backend).astype(
        jnp.float32) ** 2)

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = jax.grad(loss, argnums=(0, 1, 2))(x, w1, w2, backend)
  assert calls == ["pallas"]
  want = jax.grad(loss, argnums=(0, 1, 2))(x, w1, w2, "xla")
  for g, w in zip(got, want):
    assert rel_err(g, w) < 2e-2 and bool(jnp.all(jnp.isfinite(g)))


def _call(p: Problem, dtype, backend="auto"):
  x, rw, w1, w2 = (a.astype(dtype) for a in make_inputs(p))
  plan = sonic_jax.route(x, rw, top_k=p.K)
  return x, rw, w1, w2, plan


@pytest.mark.parametrize("d, n, want", [(1536, 512, "ffi"), (64, 264, "pallas")])
def test_auto_runs_the_shapes_first_backend(fake_gpu, d, n, want):
  calls = fake_gpu("pallas", "ffi")
  p = Problem(T=32, d=d, n=n, E=4, K=2)
  x, rw, w1, w2, plan = _call(p, jnp.bfloat16)
  assert sonic_jax.select_backend("auto", x, plan, w1, w2).name == want
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # nothing passed over: no warning
    out = sonic_jax.moe(x, rw, w1, w2, top_k=p.K)
  assert calls == [want]
  ref = moe_reference(*(a.astype(jnp.float32) for a in (x, rw, w1, w2)), top_k=p.K)
  assert rel_err(out, ref) < 2e-2


def test_auto_passes_over_a_backend_that_rejects_the_call(fake_gpu):
  calls = fake_gpu("pallas", "ffi")
  p = Problem(T=32, d=1536, n=512, E=4, K=2)
  x, rw, w1, w2, plan = _call(p, jnp.float32)
  with pytest.warns(UserWarning, match=r"on xla: ffi: x must be bfloat16.*pallas: x must be"):
    kernels = sonic_jax.select_backend("auto", x, plan, w1, w2)
  assert kernels.name == "xla"
  with pytest.warns(UserWarning, match="backend='auto' runs this call"):
    out = jax.grad(lambda x: jnp.sum(sonic_jax.moe(x, rw, w1, w2, top_k=p.K) ** 2))(x)
  assert calls == [] and bool(jnp.all(jnp.isfinite(out)))


def test_named_backend_is_validated_not_replaced(fake_gpu):
  fake_gpu("pallas", "ffi")
  p = Problem(T=16, d=64, n=32, E=4, K=2)
  x, _, w1, w2, plan = _call(p, jnp.float32)
  with pytest.raises(ValueError, match="x must be bfloat16 for backend='ffi'"):
    sonic_jax.select_backend("ffi", x, plan, w1, w2)
  kern = XlaKernels()
  assert sonic_jax.select_backend(kern, x, plan, w1, w2) is kern


def test_named_backend_unavailable_says_why(fake_gpu):
  fake_gpu()
  p = Problem(T=16, d=64, n=32, E=4, K=2)
  x, _, w1, w2, plan = _call(p, jnp.bfloat16)
  with pytest.raises(sonic_jax.BackendUnavailableError, match="backend='pallas' is not"):
    sonic_jax.select_backend("pallas", x, plan, w1, w2)
  assert sonic_jax.select_backend("auto", x, plan, w1, w2).name == "xla"


@pytest.mark.gpu
def test_gpu_auto_picks_by_shape_and_dtype():
  """On a Hopper GPU with both kernel backends: ffi at (d, n) = (1536, 512), pallas+ffi at
  (768, 256) and at (768, 160), where pallas' dh cannot tile but its forward can (ffi runs the
  backward), pallas at (768, 384), xla (with a warning) for float32 operands; each matches the
  xla backend, forward and gradients, and none passes a backend over."""
  missing = {"pallas", "ffi"} - set(sonic_jax.available_backends())
  if missing:
    pytest.skip(f"needs both GPU backends; not available here: {sorted(missing)}")
  for p, want in ((Problem(T=512, d=1536, n=512, E=8, K=2), "ffi"),
                  (Problem(T=512, d=768, n=256, E=8, K=2), "pallas+ffi"),
                  (Problem(T=512, d=768, n=160, E=8, K=2), "pallas+ffi"),
                  (Problem(T=512, d=768, n=384, E=8, K=2), "pallas")):
    x, rw, w1, w2, plan = _call(p, jnp.bfloat16)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      assert sonic_jax.select_backend("auto", x, plan, w1, w2).name == want

    def loss(x, rw, w1, w2, backend, k=p.K):
      return jnp.sum(sonic_jax.moe(x, rw, w1, w2, top_k=k, backend=backend).astype(
          jnp.float32) ** 2)

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)(
        x, rw, w1, w2, "auto")
    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)(
        x, rw, w1, w2, "xla")
    assert rel_err(got[0], ref[0]) < 1e-2
    for g, r in zip(got[1], ref[1]):
      assert rel_err(g, r) < 2e-2 and bool(jnp.all(jnp.isfinite(g)))
  x, rw, w1, w2, plan = _call(Problem(T=64, d=1536, n=512, E=4, K=2), jnp.float32)
  with pytest.warns(UserWarning, match="on xla"):
    assert sonic_jax.select_backend("auto", x, plan, w1, w2).name == "xla"


def test_auto_order_matches_the_recorded_h200_results():
  """The rule in auto_order against the newest recorded GPU results (the README's table): on
  every config with both GPU backends measured, auto's f+b is within 1 % of the faster one
  (fails when new results disagree with the rule, so the rule follows the measurements)."""
  import os
  from sonic_jax.bench import readme, targets
  results = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results")
  docs = readme.select(readme.load_results(results))
  assert docs, "no recorded GPU results"
  checked = 0
  for _, doc in docs:
    by = {(r["config"], r["impl"]): targets.fwdbwd_tflops(r) for r in doc["results"]}
    for r in doc["results"]:
      p, f = by.get((r["config"], "pallas")), by.get((r["config"], "ffi"))
      if r["impl"] != "pallas" or not p or not f:
        continue
      # The first of auto's order that the results measured (rows of "pallas+ffi" are newer
      # than these tables: it is checked against its own recorded profile below).
      first = next(b for b in sonic_jax.auto_order(r["d"], r["n"]) if b in ("pallas", "ffi"))
      got = {"pallas": p, "ffi": f}[first]
      assert got >= 0.99 * max(p, f), (r["config"], p, f)
      checked += 1
  assert checked >= 12


def test_pallas_ffi_rule_matches_the_recorded_profiles():
  """Where auto puts "pallas+ffi" first (n <= PALLAS_FFI_MAX_N), its recorded layer step is
  within 1 % of the faster single backend, in the same interleaved profile (session 37's H200
  and H100 calls); where n is larger it was not faster than ffi by more than 1 %. Configs whose
  rounds ran below full clock (power capping: 30B-n256 / -n512 on the H200, 120B-n512 on the
  H100, rounds 2-10 % apart) say nothing either way and are left out."""
  import glob
  import json
  import os
  root = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "raw",
                      "s37-2026-12-07")
  mixed = "pallas+dh/dw2/dx_pairs/dw1=ffi"
  checked = 0
  for path in sorted(glob.glob(os.path.join(root, "call*", "kernel_profile-mix.json"))):
    rows = json.load(open(path))
    totals = {(r["config"], r["variant"]): r["total_ms"] for r in rows}
    shapes = {r["config"]: r["shape"] for r in rows}
    capped = {r["config"] for r in rows
              if any(g["sm_mhz_min"] < 1900 for g in r["round_gpu_states"])}
    for config, (_, d, n, _, _) in shapes.items():
      if (config, mixed) not in totals or config in capped:
        continue
      best = min(totals[config, "pallas"], totals[config, "ffi"])
      if sonic_jax.auto_order(d, n)[0] == "pallas+ffi":
        assert totals[config, mixed] <= 1.01 * best, (path, config)
      else:
        assert totals[config, mixed] >= 0.99 * totals[config, "ffi"], (path, config)
      checked += 1
  assert checked >= 5
