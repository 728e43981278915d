"""CPU tests of sonic_jax.bench.timing's shared measurement loop and of pallas.configs.autotune."""

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sonic_jax.bench import timing
from sonic_jax.pallas import configs as cfgs


def _counting_fn(calls: list):
  """A jittable function whose every execution (not trace) appends to ``calls``."""
  def fn(x, w):
    jax.debug.callback(lambda: calls.append(1))
    return jnp.tanh(x @ w), jnp.sum(x, axis=0)
  return fn


def test_compile_and_time_counts_calls_and_keeps_first_outputs():
  if timing.on_gpu():
    pytest.skip("the wall-clock path (the CUPTI path runs the function more often)")
  x = jax.random.normal(jax.random.key(0), (64, 32), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (32, 16), jnp.float32)
  calls: list = []
  m = timing.compile_and_time(_counting_fn(calls), (x, w), iters=5, warmup=2)
  jax.effects_barrier()
  assert len(calls) == 1 + 2 + 5  # first call, warm-up, timed
  want = (np.tanh(np.asarray(x, np.float64) @ np.asarray(w, np.float64)),
          np.asarray(x, np.float64).sum(0))
  for got, ref in zip(m.out, want):
    assert np.linalg.norm(np.asarray(got) - ref) / np.linalg.norm(ref) < 1e-5
  t = m.timing
  assert t.timer == "wall" and t.note is None and len(t.samples_ms) == 5
  assert all(s > 0 and np.isfinite(s) for s in t.samples_ms)
  assert t.median_ms == statistics.median(t.samples_ms) == t.wall_median_ms
  assert m.first_call_s >= m.compiled.compile_s > 0
  assert m.compiled.memory is None or m.compiled.memory["output_size_in_bytes"] > 0


def test_compile_and_time_keep_out_false_drops_the_first_outputs_and_still_times():
  if timing.on_gpu():
    pytest.skip("the wall-clock path (the CUPTI path runs the function more often)")
  calls: list = []
  x = jax.random.normal(jax.random.key(2), (16, 8), jnp.float32)
  w = jax.random.normal(jax.random.key(3), (8, 4), jnp.float32)
  m = timing.compile_and_time(_counting_fn(calls), (x, w), iters=3, warmup=1, keep_out=False)
  jax.effects_barrier()
  assert m.out is None and len(calls) == 1 + 1 + 3
  assert len(m.timing.samples_ms) == 3 and m.first_call_s >= m.compiled.compile_s > 0


def test_compile_and_time_iters_zero_runs_once_without_timing():
  calls: list = []
  x = jnp.ones((8, 4), jnp.float32) * 0.5
  w = jnp.full((4, 2), 0.25, jnp.float32)
  m = timing.compile_and_time(_counting_fn(calls), (x, w), iters=0, warmup=3)
  jax.effects_barrier()
  assert m.timing is None and len(calls) == 1
  np.testing.assert_allclose(np.asarray(m.out[0]), np.tanh(0.5), rtol=1e-6)


def test_compile_and_time_rejects_bad_counts():
  x = jnp.ones((2, 2))
  with pytest.raises(ValueError, match="iters must be >= 0"):
    timing.compile_and_time(lambda a: a, (x,), iters=-1)
  with pytest.raises(ValueError, match="warmup must be >= 0"):
    timing.compile_and_time(lambda a: a, (x,), iters=1, warmup=-1)
  with pytest.raises(ValueError, match="iters must be >= 1"):
    timing.time_thunk(lambda: x, iters=0)
  with pytest.raises(ValueError, match="warmup must be >= 0"):
    timing.time_thunk(lambda: x, iters=1, warmup=-2)


def test_time_thunk_is_wall_clock_and_not_jitted():
  calls: list = []
  x = jnp.arange(4.0)

  def thunk():
    calls.append(1)  # Python side effect: runs on every call only if the thunk is not traced
    time.sleep(0.003)
    return x * 2

  t = timing.time_thunk(thunk, warmup=2, iters=4)
  assert len(calls) == 2 + 4
  assert t.timer == "wall" and len(t.samples_ms) == 4
  assert t.median_ms == statistics.median(t.samples_ms) and t.median_ms >= 3.0


def test_autotune_picks_fastest_caches_and_skips_failures(tmp_path, monkeypatch):
  path = tmp_path / "autotune.json"
  monkeypatch.setenv("SONIC_JAX_AUTOTUNE_CACHE", str(path))
  slow = cfgs.GemmConfig(block_n=128)
  fast = cfgs.GemmConfig(block_n=64, max_concurrent_steps=3)
  broken = cfgs.GemmConfig(block_n=32)
  ran: list = []

  def run(cfg):
    ran.append(cfg)
    if cfg == broken:
      raise RuntimeError("does not compile")
    time.sleep(0.030 if cfg == slow else 0.001)
    return jnp.zeros(())

  key = "up_proj T=8 d=16 n=32 test-device"
  assert cfgs.autotune(key, run, [slow, broken, fast]) == fast  # default measure: time_thunk
  assert ran.count(slow) == ran.count(fast) == 1 + 5  # one warm-up, median of 5
  assert json.loads(path.read_text())[key]["block_n"] == 64
  assert cfgs.load_cached(key) == fast
  ran.clear()
  assert cfgs.autotune(key, run, [slow]) == fast and not ran  # cached: nothing runs
  with pytest.raises(ValueError, match="no candidate config ran"):
    cfgs.autotune("other key", run, [broken])
