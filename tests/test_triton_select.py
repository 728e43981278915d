"""sonic_jax.triton.select_top_per_column (radix select) against sonic_jax.routing's bisection.

CPU: the Pallas-Triton kernel in interpret mode (tiny shapes, several chunks per column, every
radix width) with exact mask equality, and the wrapper's validation.
GPU (marked): both implementations at the token-rounding sizes, exact equality.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sonic_jax import routing
from sonic_jax import triton as tri
from tests.helpers import gpu_triton_impls

_ALL_BITS = [tri.SelectConfig(chunk=32, radix_bits=b) for b in (8, 4, 2)]


def _check(values, counts, impl="pallas_triton", config=None, interpret=True):
  values = jnp.asarray(values, jnp.float32)
  counts = jnp.asarray(counts, jnp.int32)
  got = tri.select_top_per_column(values, counts, impl=impl, config=config, interpret=interpret)
  ref = routing.select_top_per_column(values, counts)
  got, ref = np.asarray(got), np.asarray(ref)
  assert got.dtype == np.bool_ and got.shape == values.shape
  np.testing.assert_array_equal(got, ref)
  # The contract itself, so that a bug shared with the reference cannot hide: min(count, T)
  # rows per column, no unkept key above a kept one, and at the cut the kept rows come first.
  # (On the reference's keys: XLA may flush subnormals to zero, so numpy's order can differ.)
  np.testing.assert_array_equal(got.sum(0), np.clip(np.asarray(counts), 0, values.shape[0]))
  keys = np.asarray(routing._ordered_key(values))
  for e in range(keys.shape[1]):
    kept, rest = keys[got[:, e], e], keys[~got[:, e], e]
    if kept.size and rest.size:
      cut = kept.min()
      assert cut >= rest.max()
      at_cut = np.flatnonzero(keys[:, e] == cut)
      assert np.all(got[at_cut, e][:-1] >= got[at_cut, e][1:])  # kept ones, then unkept
  return got


def _counts(key, t, e):
  return jax.random.randint(key, (e,), 0, t + 1).at[0].set(0).at[-1].set(t)


# ------------------------------------------------------------------------- CPU: interpret
@pytest.mark.parametrize("config", _ALL_BITS, ids=lambda c: f"bits{c.radix_bits}")
def test_select_random_interpret(config):
  t, e = 203, 7  # 7 chunks of 32 per column, the last one partial
  v = jax.random.normal(jax.random.key(0), (t, e))
  _check(v, _counts(jax.random.key(1), t, e), config=config)


def test_select_default_config_interpret():
  t, e = 1100, 3  # pallas_triton's default chunk (1024): two chunks, the second partial
  v = jax.random.normal(jax.random.key(2), (t, e)) * 1e3
  _check(v, _counts(jax.random.key(3), t, e))


@pytest.mark.parametrize("config", _ALL_BITS[:2], ids=lambda c: f"bits{c.radix_bits}")
def test_select_heavy_ties_interpret(config):
  # Four levels: every cut falls inside a run of equal values that spans several chunks, so the
  # earliest-rows rule and the running tie count across chunks decide the mask.
  t, e = 150, 5
  v = jax.random.randint(jax.random.key(4), (t, e), -2, 2).astype(jnp.float32) * 0.25
  v = v.at[:, 2].set(0.75)  # one column all equal: the first counts[2] rows
  counts = jnp.array([0, 1, 77, 149, 150], jnp.int32)
  got = _check(v, counts, config=config)
  np.testing.assert_array_equal(got[:, 2], np.arange(t) < 77)


def test_select_signed_zeros_and_infinities_interpret():
  # -0.0 ranks equal to +0.0 (earlier rows first among them); -inf and +inf are ordinary keys.
  t, e = 97, 6
  k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
  zeros = jnp.where(jax.random.bernoulli(k1, 0.5, (t, e)), 0.0, -0.0)
  v = jnp.where(jax.random.bernoulli(k2, 0.7, (t, e)), zeros,
                jax.random.normal(k3, (t, e)))
  v = v.at[::5, 1].set(-jnp.inf).at[::7, 3].set(jnp.inf).at[:, 4].set(-jnp.inf)
  counts = jnp.array([40, 90, 13, 60, 33, 97], jnp.int32)
  got = _check(v, counts, config=tri.SelectConfig(chunk=16, radix_bits=8))
  np.testing.assert_array_equal(got[:, 4], np.arange(t) < 33)
  # Tiny magnitudes next to zero and the extremes of the float range.
  w = jnp.array([[1e-45, -1e-45, 0.0, -0.0, 3.4e38, -3.4e38, 1e-38, -1e-38] * 4] * 3,
                jnp.float32).T
  _check(w, jnp.array([3, 17, 32], jnp.int32), config=tri.SelectConfig(chunk=16, radix_bits=4))


def test_select_one_row_and_token_rounding_ranking_interpret():
  _check(jnp.array([[0.5, -1.0, 0.0]]), jnp.array([1, 0, 1]),
         config=tri.SelectConfig(chunk=16, radix_bits=8))
  # The ranking token rounding builds: chosen pairs in (0, 1], the others p - 1 in (-1, 0].
  t, e, k = 120, 10, 2
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(6), (t, e)) * 3, axis=-1)
  top_p, top_e = jax.lax.top_k(probs, k)
  rows = jnp.arange(t)[:, None]
  rank = (probs - 1.0).at[rows, top_e].set(top_p / jnp.sum(top_p, -1, keepdims=True))
  counts = jnp.minimum(jnp.round(jnp.sum(jax.nn.one_hot(top_e, e), (0, 1)) / 16) * 16, t)
  _check(rank, counts.astype(jnp.int32), config=tri.SelectConfig(chunk=64, radix_bits=4))


def test_select_traced_counts_and_vmap_interpret():
  t, e = 40, 3
  v = jax.random.normal(jax.random.key(7), (2, t, e))
  c = jnp.array([[5, 0, 40], [39, 1, 20]], jnp.int32)
  fn = jax.jit(jax.vmap(lambda v_, c_: tri.select_top_per_column(
      v_, c_, impl="pallas_triton", interpret=True, config=tri.SelectConfig(chunk=16))))
  got = np.asarray(fn(v, c))
  for i in range(2):
    np.testing.assert_array_equal(got[i], np.asarray(routing.select_top_per_column(v[i], c[i])))


def test_select_validation():
  v = jnp.zeros((8, 3), jnp.float32)
  c = jnp.zeros((3,), jnp.int32)
  kw = dict(impl="pallas_triton", interpret=True)
  with pytest.raises(ValueError, match="values must have shape"):
    tri.select_top_per_column(v[0], c, **kw)
  with pytest.raises(ValueError, match="values must be float32"):
    tri.select_top_per_column(v.astype(jnp.bfloat16), c, **kw)
  with pytest.raises(ValueError, match="at least one row"):
    tri.select_top_per_column(v[:0], c, **kw)
  with pytest.raises(ValueError, match="counts must have shape"):
    tri.select_top_per_column(v, c[:2], **kw)
  with pytest.raises(ValueError, match="counts must be an integer"):
    tri.select_top_per_column(v, c.astype(jnp.float32), **kw)
  with pytest.raises(ValueError, match=r"counts must lie in \[0, T\]"):
    tri.select_top_per_column(v, c.at[1].set(9), **kw)
  with pytest.raises(ValueError, match=r"counts must lie in \[0, T\]"):
    tri.select_top_per_column(v, c.at[0].set(-1), **kw)
  with pytest.raises(ValueError, match="impl must be one of"):
    tri.select_top_per_column(v, c, impl="cuda", interpret=True)
  with pytest.raises(ValueError, match="interpret=True needs impl='pallas_triton'"):
    tri.select_top_per_column(v, c, impl="jax_triton", interpret=True)
  with pytest.raises(ValueError, match="SelectConfig.chunk"):
    tri.SelectConfig(chunk=48)
  with pytest.raises(ValueError, match="SelectConfig.radix_bits"):
    tri.SelectConfig(radix_bits=16)
  with pytest.raises(ValueError, match="SelectConfig.num_warps"):
    tri.SelectConfig(num_warps=3)


# ---------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton"])
@pytest.mark.parametrize("e", [128, 256])
@pytest.mark.parametrize("data", ["normal", "ties"])
def test_gpu_select(impl, e, data):
  if impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  t = 32768
  v = jax.random.normal(jax.random.key(30), (t, e))
  if data == "ties":  # few levels, signed zeros, -inf: cuts inside long runs of equal keys
    v = jnp.round(v * 2) / 2
    v = jnp.where(v == 0, jnp.where(jnp.arange(t)[:, None] % 2 == 0, 0.0, -0.0), v)
    v = v.at[::3, 1].set(-jnp.inf).at[:, 2].set(0.5)
  c = jax.random.randint(jax.random.key(31), (e,), 0, min(t, 16 * t // e) + 1)
  c = c.at[0].set(0).at[1].set(t).at[2].set(t // 3)
  _check(v, c, impl=impl, interpret=False)
  if impl == "jax_triton" or data == "ties":  # other digit widths and chunks
    for cfg in (tri.SelectConfig(chunk=256, radix_bits=4),
                tri.SelectConfig(chunk=2048, radix_bits=8, num_warps=8)):
      _check(v, c, impl=impl, config=cfg, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["jax_triton", "pallas_triton", "auto"])
def test_gpu_token_rounding_routes_with_the_select_kernel(impl):
  """route_logits(routing=token rounding, impl=...) selects with the radix kernel: the same plan
  as the xla path bit for bit, and the same score gradients."""
  if impl != "auto" and impl not in gpu_triton_impls():
    pytest.skip(tri.jax_triton_unavailable_reason())
  t, e, k = 8192, 128, 8
  logits = jax.random.normal(jax.random.key(32), (t, e)) * 2
  tr = routing.TokenRounding()
  ref = jax.jit(lambda lg: routing.route_logits(lg, top_k=k, routing=tr))(logits)
  got = jax.jit(lambda lg: routing.route_logits(lg, top_k=k, routing=tr, impl=impl))(logits)
  for name in ("token_ids", "expert_ids", "group_sizes", "group_offsets", "gather_idx"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(ref, name)),
                                  err_msg=name)
  # Scores: two XLA programs may fuse the softmax differently (last-bit differences).
  np.testing.assert_allclose(np.asarray(got.scores), np.asarray(ref.scores), rtol=1e-6, atol=0)
  grad = lambda i: jax.jit(jax.grad(lambda lg: jnp.sum(routing.route_logits(
      lg, top_k=k, routing=tr, impl=i).scores ** 2)))(logits)
  g, g_ref = np.asarray(grad(impl), np.float64), np.asarray(grad("xla"), np.float64)
  # Same plan, so the same gradient up to the summation order of the two XLA programs (entries
  # that cancel to 0 in one come out ~1e-9 in the other on the H200): relative error.
  assert np.isfinite(g).all() and np.linalg.norm(g - g_ref) <= 1e-6 * np.linalg.norm(g_ref)
