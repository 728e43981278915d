"""Timing and memory measurement of compiled JAX functions.

On a GPU the time is the sum of the kernel durations of one call, read by CUPTI through
``jax.experimental.mosaic.gpu.profiler.measure`` (host launch gaps excluded), median over the
iterations after a warm-up. Elsewhere, or when CUPTI is unavailable, it is the host wall clock
around ``block_until_ready`` (median), and results say so (``timer``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax

_CUPTI_BROKEN: list[str] = []  # CUPTI failures; after two, later calls go straight to wall


@dataclasses.dataclass
class Compiled:
  fn: Any                 # jax.stages.Compiled
  compile_s: float        # trace + lower + compile
  memory: dict | None     # from memory_analysis(), bytes


@dataclasses.dataclass
class Timing:
  median_ms: float
  timer: str              # "cupti" or "wall"
  samples_ms: list[float]
  wall_median_ms: float | None = None
  note: str | None = None
  # time.time() at the start and end of the timed calls (the median's samples), for the GPU
  # state of that interval (gpu_state.SmiSampler.interval).
  window: tuple[float, float] | None = None


def on_gpu() -> bool:
  try:
    return jax.devices()[0].platform == "gpu"
  except RuntimeError:
    return False


def device_label() -> str:
  """Short device name for file names: 'h200', 'h100', 'cpu', ..."""
  dev = jax.devices()[0]
  if dev.platform != "gpu":
    return dev.platform
  kind = dev.device_kind.lower().replace("nvidia", "").strip()
  return kind.split()[0].replace("/", "-") if kind else "gpu"


def compile_fn(fn: Callable, args: tuple) -> Compiled:
  """jit + lower + compile ``fn`` for ``args``; records the time and the memory analysis."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  memory = None
  try:
    ma = compiled.memory_analysis()
    if ma is not None:
      memory = {k: int(getattr(ma, k)) for k in (
          "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
          "alias_size_in_bytes") if hasattr(ma, k)}
      memory["footprint_bytes"] = (
          memory.get("argument_size_in_bytes", 0) + memory.get("output_size_in_bytes", 0)
          + memory.get("temp_size_in_bytes", 0) - memory.get("alias_size_in_bytes", 0))
  except Exception:  # noqa: BLE001 - memory analysis is optional on some platforms
    memory = None
  return Compiled(compiled, compile_s, memory)


def _wall_samples(fn, args, iters: int) -> list[float]:
  out = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    out.append((time.perf_counter() - t0) * 1e3)
  return out


def _cupti_samples(fn, args, iters: int, out_bytes: int, max_live_bytes: int) -> list[float]:
  from jax.experimental.mosaic.gpu import profiler
  # measure() keeps every iteration's outputs alive until the end: bound how many at a time.
  per_call = max(1, min(iters, max_live_bytes // max(out_bytes, 1)))
  samples: list[float] = []
  while len(samples) < iters:
    k = min(per_call, iters - len(samples))
    result, t = profiler.measure(fn, iterations=k)(*args)
    del result
    if t is None:
      raise RuntimeError("CUPTI saw no kernel launches")
    samples += [float(v) for v in (t if isinstance(t, list) else [t])]
  return samples


def time_compiled(c: Compiled, args: tuple, *, warmup: int, iters: int, wall_too: bool = True,
                  max_live_bytes: int = 8 << 30) -> Timing:
  """Median time of ``c.fn(*args)`` after ``warmup`` calls (CUPTI on a GPU, else wall).

  The caller has run ``c.fn`` once already (first-call time), so warmup=0 is allowed.
  """
  fn = c.fn
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  out_bytes = (c.memory or {}).get("output_size_in_bytes", 0)
  note = None
  if on_gpu() and len(_CUPTI_BROKEN) < 2:
    try:
      t0 = time.time()
      samples = _cupti_samples(fn, args, iters, out_bytes, max_live_bytes)
      window = (t0, time.time())
      wall = statistics.median(_wall_samples(fn, args, iters)) if wall_too else None
      return Timing(statistics.median(samples), "cupti", samples, wall, window=window)
    except Exception as e:  # noqa: BLE001 - fall back to wall-clock timing, say why
      _CUPTI_BROKEN.append(f"{type(e).__name__}: {e}"[:200])
      note = f"CUPTI failed ({_CUPTI_BROKEN[-1]}); wall clock"
  t0 = time.time()
  samples = _wall_samples(fn, args, iters)
  med = statistics.median(samples)
  return Timing(med, "wall", samples, med, note, window=(t0, time.time()))


@dataclasses.dataclass
class Measured:
  """What ``compile_and_time`` returns."""
  compiled: Compiled
  first_call_s: float     # trace + lower + compile + the first call
  out: Any                # the first call's outputs (for correctness checks); None: not kept
  timing: Timing | None   # None when iters == 0 (compile and run once, no timing)


def compile_and_time(fn: Callable, args: tuple, *, iters: int, warmup: int = 0,
                     wall_too: bool = False, max_live_bytes: int = 8 << 30,
                     keep_out: bool = True) -> Measured:
  """compile_fn + one call (first-call time) + ``time_compiled``.

  The loop every GPU measurement shares. ``warmup`` counts calls after the first one;
  on a GPU each CUPTI batch starts with one more (``profiler.measure``'s own warm-up).
  ``iters=0`` only compiles and runs once (interpreter smoke runs time nothing).
  ``keep_out=False`` frees the first call's outputs before timing (large layer steps).
  """
  if iters < 0:
    raise ValueError(f"compile_and_time: iters must be >= 0, got {iters}")
  if warmup < 0:
    raise ValueError(f"compile_and_time: warmup must be >= 0, got {warmup}")
  c = compile_fn(fn, args)
  t0 = time.perf_counter()
  out = jax.block_until_ready(c.fn(*args))
  first_call_s = c.compile_s + (time.perf_counter() - t0)
  if not keep_out:
    out = None
  timing = None
  if iters:
    timing = time_compiled(c, args, warmup=warmup, iters=iters, wall_too=wall_too,
                           max_live_bytes=max_live_bytes)
  return Measured(c, first_call_s, out, timing)


def time_thunk(thunk: Callable[[], Any], *, warmup: int = 1, iters: int) -> Timing:
  """Wall-clock median of ``thunk()`` (block_until_ready) after ``warmup`` calls, any device.

  For zero-argument callables (e.g. ``pallas.configs.autotune``): CUPTI through
  ``profiler.measure`` would jit the thunk, which makes the arrays it closes over compile-time
  constants (and lets XLA fold them), so a thunk gets the host clock, launch gaps included.
  """
  if iters < 1:
    raise ValueError(f"time_thunk: iters must be >= 1, got {iters}")
  if warmup < 0:
    raise ValueError(f"time_thunk: warmup must be >= 0, got {warmup}")
  for _ in range(warmup):
    jax.block_until_ready(thunk())
  samples = _wall_samples(thunk, (), iters)
  med = statistics.median(samples)
  return Timing(med, "wall", samples, med)


def kernel_medians(timings: list[list[tuple[str, float]]]):
  """Per-iteration CUPTI kernel lists -> (names, per-kernel medians, median total, iterations
  used). An iteration can launch a few more or fewer kernels than the others (e.g. a memset),
  which would shift every later index: only the iterations with the most common kernel-name
  sequence are compared index by index. The total is the median of the per-iteration sums of
  all iterations."""
  seqs = [tuple(nm for nm, _ in it) for it in timings]
  usual = max(set(seqs), key=seqs.count)
  same = [it for it, sq in zip(timings, seqs) if sq == usual]
  med = [statistics.median(it[i][1] for it in same) for i in range(len(usual))]
  total = statistics.median(sum(t for _, t in it) for it in timings)
  return list(usual), med, total, len(same)


def memory_stats() -> dict | None:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001
    return None
  if not stats:
    return None
  return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
          if k in stats}
