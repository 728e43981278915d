"""Routing plans: top-K structure and token rounding's properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sonic_jax
from sonic_jax.reference import plan_gates
from sonic_jax.routing import RoutingPlan


def _logits(T, E, seed=0, hot=None):
  z = jax.random.normal(jax.random.key(seed), (T, E))
  if hot is not None:
    z = z.at[:, hot].add(6.0)
  return z


def _check_plan_invariants(plan: RoutingPlan):
  P, T, E = plan.capacity, plan.num_tokens, plan.num_experts
  n = int(plan.num_pairs)
  scatter, reverse = np.asarray(plan.scatter_idx), np.asarray(plan.reverse_idx)
  assert sorted(scatter.tolist()) == list(range(P))           # a permutation
  np.testing.assert_array_equal(reverse[scatter], np.arange(P))
  gs, go = np.asarray(plan.group_sizes), np.asarray(plan.group_offsets)
  assert go[0] == 0 and np.all(np.diff(go) == gs) and go[-1] == n
  tok, exp = np.asarray(plan.token_ids), np.asarray(plan.expert_ids)
  gather = np.asarray(plan.gather_idx)
  for e in range(E):
    rows = scatter[go[e]:go[e + 1]]
    assert np.all(exp[rows] == e) and np.all(np.diff(rows) > 0)  # stable within expert
    np.testing.assert_array_equal(gather[go[e]:go[e + 1]], tok[rows])
  assert np.all(scatter[n:] >= n)                                 # padding stays padding
  assert np.all(np.diff(tok[:n]) >= 0)                            # flat order sorted by token
  to = np.asarray(plan.token_offsets)
  assert to[0] == 0 and to[-1] == n
  for t in range(T):
    assert np.all(tok[to[t]:to[t + 1]] == t)
  assert np.all(np.asarray(plan.scores)[n:] == 0)


@pytest.mark.parametrize("T,E,K", [(32, 8, 2), (17, 5, 1), (40, 6, 6)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_plan(T, E, K, renormalize):
  logits = _logits(T, E)
  plan = sonic_jax.route_logits(logits, top_k=K, renormalize=renormalize)
  assert plan.capacity == T * K and plan.top_k == K
  _check_plan_invariants(plan)
  probs = jax.nn.softmax(logits, -1)
  top_p, top_e = jax.lax.top_k(probs, K)
  np.testing.assert_array_equal(np.asarray(plan.expert_ids).reshape(T, K), top_e)
  want = top_p / top_p.sum(-1, keepdims=True) if renormalize else top_p
  np.testing.assert_allclose(np.asarray(plan.scores).reshape(T, K), want, rtol=1e-6)
  assert plan.scores.dtype == jnp.float32


def test_topk_plan_jits_and_is_a_pytree():
  plan = jax.jit(lambda z: sonic_jax.route_logits(z, top_k=2))(_logits(16, 4))
  leaves, tree = jax.tree.flatten(plan)
  assert len(leaves) == 9 and jax.tree.unflatten(tree, leaves).num_experts == 4


def _tc_chosen(logits, K):
  _, top_e = jax.lax.top_k(jax.nn.softmax(logits, -1), K)
  chosen = np.zeros(logits.shape, bool)
  np.put_along_axis(chosen, np.asarray(top_e), True, axis=1)
  return chosen


def _kept(plan):
  n = int(plan.num_pairs)
  kept = np.zeros((plan.num_tokens, plan.num_experts), bool)
  kept[np.asarray(plan.token_ids)[:n], np.asarray(plan.expert_ids)[:n]] = True
  return kept


@pytest.mark.parametrize("mode", ["nearest", "up", "down"])
@pytest.mark.parametrize("hot", [None, 2])
def test_token_rounding_properties(mode, hot):
  T, E, K, tile = 200, 6, 2, 16
  logits = _logits(T, E, seed=1, hot=hot)
  tr = sonic_jax.TokenRounding(tile=tile, mode=mode)
  plan = jax.jit(lambda z: sonic_jax.route_logits(z, top_k=K, routing=tr))(logits)
  _check_plan_invariants(plan)
  assert plan.top_k is None and plan.capacity == tr.capacity(T, E, K)
  chosen, kept = _tc_chosen(logits, K), _kept(plan)
  f, f_new = chosen.sum(0), np.asarray(plan.group_sizes)
  np.testing.assert_array_equal(kept.sum(0), f_new)
  for e in range(E):
    assert f_new[e] % tile == 0 or f_new[e] == T
    assert abs(int(f_new[e]) - int(f[e])) < tile
    if mode == "nearest":
      assert abs(int(f_new[e]) - int(f[e])) <= tile // 2
    if mode == "up":
      assert f_new[e] >= f[e] and np.all(kept[chosen[:, e], e])
    if mode == "down":
      assert f_new[e] <= f[e] and not np.any(kept[~chosen[:, e], e])
  probs = np.asarray(jax.nn.softmax(logits, -1))
  top_p = np.sort(probs, -1)[:, ::-1][:, :K]
  v = np.where(chosen, probs / top_p.sum(-1, keepdims=True), -1.0)
  for e in range(E):
    c, k = chosen[:, e], kept[:, e]
    if np.any(c & ~k):   # dropped choices rank below every kept choice of that expert
      assert v[c & ~k, e].max() <= v[c & k, e].min() if np.any(c & k) else True
    if np.any(~c & k):   # added tokens are the most probable unchosen ones
      assert probs[~c & k, e].min() >= probs[~c & ~k, e].max()
  # Kept pairs carry p / (sum of the token's top-K p): renormalize=True by default.
  n = int(plan.num_pairs)
  t, e = np.asarray(plan.token_ids)[:n], np.asarray(plan.expert_ids)[:n]
  np.testing.assert_allclose(np.asarray(plan.scores)[:n], probs[t, e] / top_p.sum(-1)[t],
                             rtol=1e-5)


def test_token_rounding_with_tile_one_is_topk():
  logits = _logits(24, 5, seed=2)
  a = sonic_jax.route_logits(logits, top_k=2)
  b = sonic_jax.route_logits(logits, top_k=2, routing=sonic_jax.TokenRounding(tile=1))
  assert int(b.num_pairs) == 48
  # Same pairs and scores (within a token, top-K orders by score and rounding by expert id).
  np.testing.assert_array_equal(a.group_sizes, b.group_sizes)
  np.testing.assert_array_equal(a.token_ids, b.token_ids[:48])
  np.testing.assert_allclose(plan_gates(a), plan_gates(b), rtol=1e-6)


def test_token_rounding_string_and_router_gradient():
  x = jax.random.normal(jax.random.key(0), (256, 8))
  rw = jax.random.normal(jax.random.key(1), (8, 4))
  plan = sonic_jax.route(x, rw, top_k=2, routing="token_rounding")
  assert np.all(np.asarray(plan.group_sizes) % 128 == 0)
  g = jax.grad(lambda rw: jnp.sum(sonic_jax.route(
      x, rw, top_k=2, routing="token_rounding").scores ** 2))(rw)
  assert float(jnp.linalg.norm(g)) > 0


def test_load_balancing_loss_is_one_when_uniform():
  logits = jnp.zeros((8, 4))
  plan = RoutingPlan.from_assignments(jnp.arange(8), jnp.arange(8) % 4, jnp.ones(8),
                                      num_tokens=8, num_experts=4, top_k=1)
  assert abs(float(sonic_jax.load_balancing_loss(logits, plan)) - 1.0) < 1e-6
  assert float(sonic_jax.wasted_ratio(plan, 4)) == 1.0


def _argsort_select(values, counts):
  """Reference for select_top_per_column: place of each row in a stable descending argsort."""
  t, e = values.shape
  order = np.argsort(-np.asarray(values), axis=0, kind="stable")
  position = np.empty_like(order)
  position[order, np.arange(e)[None, :]] = np.arange(t)[:, None]
  return position < np.asarray(counts)[None, :]


@pytest.mark.parametrize("seed", range(6))
def test_select_top_per_column_matches_stable_argsort(seed):
  from sonic_jax.routing import select_top_per_column
  rng = np.random.default_rng(seed)
  t, e = int(rng.integers(1, 300)), int(rng.integers(1, 20))
  kind = seed % 3
  if kind == 0:  # distinct values spanning both signs and tiny magnitudes
    v = rng.normal(size=(t, e)).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 3, (t, e))
  elif kind == 1:  # heavy ties: a few distinct levels, plus -0.0 / 0.0
    v = rng.choice(np.array([-1.0, -0.5, -0.0, 0.0, 0.25, 1.0], np.float32), size=(t, e))
  else:  # the token-rounding ranking: chosen in (0, 1], unchosen p - 1 in (-1, 0]
    p = rng.dirichlet(np.ones(e) * 0.3, size=t).astype(np.float32)
    v = np.where(rng.random((t, e)) < 0.3, p / p.max(), p - np.float32(1.0)).astype(np.float32)
  counts = rng.integers(0, t + 1, size=e).astype(np.int32)
  counts[0] = 0
  counts[-1] = t
  got = np.asarray(jax.jit(select_top_per_column)(jnp.asarray(v), jnp.asarray(counts)))
  np.testing.assert_array_equal(got, _argsort_select(v, counts))
  np.testing.assert_array_equal(got.sum(0), counts)


def test_fixed_top_k_only_for_token_major_plans():
  """RoutingPlan.fixed_top_k: K for top-K plans (P = T·K), None for token rounding (padding,
  a variable pair count per token) and for a top_k that does not match the capacity."""
  logits = jax.random.normal(jax.random.key(0), (24, 6))
  plan = sonic_jax.route_logits(logits, top_k=2)
  assert plan.fixed_top_k == 2
  tr = sonic_jax.route_logits(logits, top_k=2, routing=sonic_jax.TokenRounding(tile=4))
  assert tr.top_k is None and tr.fixed_top_k is None
  assert plan.replace(top_k=3).fixed_top_k is None


def test_grouped_expert_ids_follow_group_offsets():
  """RoutingPlan.grouped_expert_ids: grouped row p belongs to the expert whose
  [group_offsets[e], group_offsets[e + 1]) holds p; padding rows (token rounding) read 0."""
  logits = jax.random.normal(jax.random.key(1), (40, 7))
  for plan in (sonic_jax.route_logits(logits, top_k=3),
               sonic_jax.route_logits(logits, top_k=3, routing=sonic_jax.TokenRounding(tile=8))):
    offs = np.asarray(plan.group_offsets)
    got = np.asarray(plan.grouped_expert_ids())
    want = np.repeat(np.arange(plan.num_experts), np.diff(offs))
    np.testing.assert_array_equal(got[:offs[-1]], want)
    assert (got[offs[-1]:] == 0).all()
