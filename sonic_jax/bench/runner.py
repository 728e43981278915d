"""Runs implementations over configs and collects one result row per (config, implementation).

Work is done in passes so a time budget cuts the least important part: (1) sonic_jax backends
and the dense ceiling on every config, (2) correctness checks against the xla backend at a small
T, (3) JAX baselines, (4) the PyTorch SonicMoE. Every failure is caught and recorded in its row;
the JSON file is rewritten after every step, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import platform
import sys
import time
import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.bench.configs import BenchConfig, flops
from sonic_jax.bench.gpu_state import SmiSampler
from sonic_jax.bench.impls import Impl, dense_ref_bytes, make_impl
from sonic_jax.bench.problems import RoutingSpec, make_problem, routing_stats, sonic_layer
from sonic_jax.bench.timing import (Measured, compile_and_time, device_label, memory_stats,
                                    on_gpu)

MODES = ("fwd", "bwd", "fwdbwd")
# Weights of the passes in --time-budget-s (backends + ceiling, their checks, JAX baselines,
# their checks, PyTorch SonicMoE). Each pass that has work may start jobs until its cumulative
# share of the budget (renormalized over the passes with work) is spent.
PASS_WEIGHTS = (60, 8, 20, 4, 8)


CHECK_ONLY = "check-only"  # row status of a --check-only run: checked, not timed


@dataclasses.dataclass
class Options:
  warmup: int = 3
  iters: int = 10
  modes: tuple[str, ...] = MODES
  bwd_direct: bool = False       # time the backward alone (else (fwd+bwd) - fwd, as the paper)
  check: bool = True
  check_budget_gib: float = 2.0  # xla reference temporary allowed for the check (GPU)
  check_max_tokens: int = 4096
  check_tol: float = 3e-2        # relative error bound, bf16 operands
  dense_ref_budget_gib: float = 8.0
  time_budget_s: float | None = None
  seed: int = 0
  check_only: bool = False       # run only the checks (rows say "check-only"; merge adds them)
  gpu_state_ms: int = 50         # nvidia-smi sampling period for each timing's GPU state; 0: off

  def __post_init__(self):
    bad = [m for m in self.modes if m not in MODES]
    if bad or not self.modes:
      raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes!r}")
    if self.check_only and not self.check:
      raise ValueError("check_only needs the checks on (drop --no-check)")
    if self.iters < 1 or self.warmup < 0:
      raise ValueError(f"iters must be >= 1 and warmup >= 0, got {self.iters}, {self.warmup}")
    if self.gpu_state_ms < 0:
      raise ValueError(f"gpu_state_ms must be >= 0 (0: off), got {self.gpu_state_ms}")


def versions() -> dict:
  out = {"python": platform.python_version(), "jax": jax.__version__}
  try:
    import jaxlib
    out["jaxlib"] = jaxlib.__version__
  except Exception:  # noqa: BLE001
    pass
  import sonic_jax
  out["sonic_jax"] = getattr(sonic_jax, "__version__", "?")
  for mod in ("tokamax", "torch", "sonicmoe", "quack"):
    m = sys.modules.get(mod)
    if m is not None:
      out[mod] = getattr(m, "__version__", "?")
  return out


def _resolved_route_impl(spec: RoutingSpec) -> str:
  """What routes top-K in the timed layers here ("xla" for token rounding, always)."""
  from sonic_jax.triton import resolve_route_impl
  return "xla" if spec.method == "tr" else resolve_route_impl(spec.route_impl)


def _git_commit() -> str | None:
  try:
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, text=True,
                          capture_output=True, timeout=5).stdout.strip() or None
  except Exception:  # noqa: BLE001
    return None


def _short_error(e: BaseException) -> str:
  msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
  return msg[:300]


def training_forward(layer: Callable) -> Callable:
  """The timed training forward of ``layer``: its output and what its backward keeps, minus the
  residuals that are the layer's own inputs (x, weights). Returned from a jitted program, those
  would be copied into fresh output buffers (3.4 GB, about 1.9 ms at paper-120B-n2048): a copy
  no training step makes, where they stay in place for the backward."""

  def fwd(*args):
    out, vjp_fn = jax.vjp(layer, *args)
    return out, [r for r in jax.tree.leaves(vjp_fn) if not any(r is a for a in args)]

  return fwd


def saved_residual_bytes(layer, args) -> tuple[int | None, list]:
  """Bytes jax.vjp keeps for the backward, not counting the layer's own inputs."""
  try:
    from jax._src.ad_checkpoint import saved_residuals
  except ImportError:
    return None, []
  res = saved_residuals(layer, *args)
  total, items = 0, []
  for aval, desc in res:
    if desc.startswith("from the argument"):
      continue
    nbytes = int(np.prod(aval.shape)) * jnp.dtype(aval.dtype).itemsize
    total += nbytes
    items.append((nbytes, f"{aval.str_short(short_dtypes=True)}"))
  items.sort(reverse=True)
  return total, [s for _, s in items[:4]]


def check_config(cfg: BenchConfig, spec: RoutingSpec, opts: Options) -> BenchConfig:
  """The config the correctness check runs at: the same d, n (and K where possible) with E
  halved while the weights exceed 1 GiB (never below 2K) and T halved (to a multiple of 16)
  while the xla reference's densified temporary exceeds --check-budget-gib on a GPU."""
  e, k = cfg.E, cfg.K
  while e > max(2 * k, 2) and 3 * e * cfg.d * cfg.n * 2 > 2**30:
    e = max(e // 2, 2 * k)
  k = min(k, e)
  t = min(cfg.T, opts.check_max_tokens)
  small = dataclasses.replace(cfg, T=t, E=e, K=k, paper_tflops=None)
  if on_gpu():
    while t > 16 and dense_ref_bytes(dataclasses.replace(small, T=t), spec) > (
        opts.check_budget_gib * 2**30):
      t //= 2
  t = max(16, t - t % 16) if t >= 16 else t
  return dataclasses.replace(small, T=t, name=f"{cfg.name}@T{t}E{e}K{k}")


# What the timed step does (results meta "fwdbwd_step"). Earlier values: none (2026-12-02 to
# 12-04, session 9: the gradients alone) and "output+grads" (session 10's first runs: the output
# too, but the cotangent did not wait for it, so XLA could keep the forward's (T·K, d) Y alive
# into the backward, which inflates the step's memory).
FWDBWD_STEP = "output, barrier, grads"


def fwdbwd_step(layer: Callable) -> Callable:
  """(*inputs, cotangent) -> (output, input gradients): one training step of ``layer``, the
  timed forward+backward. The output is returned because a training step's loss consumes it:
  with the gradients alone XLA drops the forward's work the backward does not read (in the
  SonicMoE layer the down projection and the combine), and the step would be timed without it.
  A training step's cotangent comes from the loss, i.e. after the whole output; the random
  cotangent gets that dependency through an optimization barrier, so XLA cannot move the
  forward's down projection and combine into the backward, where their (T·K, d) Y would be
  alive at the backward's peak."""
  def f(*args):
    *a, g = args
    out, vjp_fn = jax.vjp(layer, *a)
    out, g = jax.lax.optimization_barrier((out, g))
    return out, vjp_fn(g)
  return f


@jax.jit
def rel_errs(got, ref):
  """Relative Frobenius errors ‖a − b‖ / ‖b‖ (fp32, on the device, no host copy) of matching
  pytrees; NaN where either side holds a NaN or inf."""
  def one(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    err = jnp.linalg.norm((a - b).ravel()) / jnp.maximum(jnp.linalg.norm(b.ravel()), 1e-30)
    return jnp.where(jnp.all(jnp.isfinite(a)) & jnp.all(jnp.isfinite(b)), err, jnp.nan)
  return jax.tree.map(one, got, ref)


_CHECK_NAMES = ("out", "dx", "drouter_w", "dw1", "dw2")


def check_against_xla(impl: Impl, cfg: BenchConfig, spec: RoutingSpec, opts: Options,
                      cache: dict | None = None) -> dict:
  small = check_config(cfg, spec, opts)
  p = make_problem(small, seed=opts.seed + 1)
  key = small.name
  if cache is not None and key in cache:
    ref = cache[key]
  else:
    ref_layer = sonic_layer("xla", small, spec)
    ref = jax.jit(fwdbwd_step(ref_layer))(*p.args, p.dout)
    if cache is not None:
      cache.clear()
      cache[key] = ref
  layer, args = impl.prepare(p, spec)
  got = jax.jit(fwdbwd_step(layer))(*args, p.dout)
  flat = jax.device_get(rel_errs((got[0], *got[1]), (ref[0], *ref[1])))
  del got
  errs = {name: float(v) for name, v in zip(_CHECK_NAMES, flat)}
  worst = max(errs.values(), key=lambda v: np.inf if np.isnan(v) else v)
  ok = bool(all(np.isfinite(v) and v <= opts.check_tol for v in errs.values()))
  return {"T": small.T, "E": small.E, "K": small.K, "ok": ok, "max_rel_err": worst,
          "errs": errs, "tol": opts.check_tol}


class Runner:
  def __init__(self, configs: list[BenchConfig], impl_names: list[str], spec: RoutingSpec,
               opts: Options, json_path: str | None = None,
               progress: Callable[[str], None] = print, command: str | None = None):
    self.configs, self.spec, self.opts = configs, spec, opts
    self.impls = [make_impl(n) for n in impl_names]
    self.json_path = json_path
    self.progress = progress
    self.start = time.perf_counter()
    self.rows: dict[tuple[str, str], dict] = {}
    self._ref_cache: dict = {}
    self._last_problem = None
    self._smi: SmiSampler | None = None
    dev = jax.devices()[0]
    self.doc = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device_label(), "device_kind": dev.device_kind, "platform": dev.platform,
            "versions": versions(), "git_commit": _git_commit(),
            "command": command or " ".join(sys.argv), "routing": spec.label,
            "routing_spec": dataclasses.asdict(spec), "options": dataclasses.asdict(opts),
            "route_impl": _resolved_route_impl(spec),
            "flops": "paper count: fwd 6, bwd 12, fwd+bwd 18 x pairs x d x n",
            # What the timed fwd+bwd step returns (fwdbwd_step): runs before this key existed
            # timed the gradients alone, without the forward's down projection and combine.
            "fwdbwd_step": FWDBWD_STEP,
            "timing": ("GPU: CUPTI sum of kernel times per call (median); torch: CUDA events; "
                       "CPU: wall clock"),
            "complete": False,
        },
        "results": [],
    }
    for cfg in configs:
      for impl in self.impls:
        row = {"config": cfg.name, "T": cfg.T, "d": cfg.d, "n": cfg.n, "E": cfg.E, "K": cfg.K,
               "routing": spec.label, "impl": impl.name, "kind": impl.kind,
               "status": "pending", "reason": None, "modes": {},
               "paper_tflops": list(cfg.paper_tflops) if cfg.paper_tflops else None,
               "sonic_h200_tflops": (list(cfg.sonic_h200_tflops) if cfg.sonic_h200_tflops
                                     else None)}
        self.rows[(cfg.name, impl.name)] = row
        self.doc["results"].append(row)
    self.total_jobs = (0 if opts.check_only else len(self.rows)) + (
        len(self.rows) if opts.check else 0)
    self.jobs_done = 0

  # ---------------------------------------------------------------- bookkeeping

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def over_budget(self, share: float = 1.0) -> bool:
    budget = self.opts.time_budget_s
    return budget is not None and self.elapsed() > budget * share

  def save(self):
    if not self.json_path:
      return
    os.makedirs(os.path.dirname(os.path.abspath(self.json_path)), exist_ok=True)
    tmp = self.json_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.doc, f, indent=1, default=_json_default)
    os.replace(tmp, self.json_path)

  def say(self, msg: str):
    self.progress(f"[{self.jobs_done:3d}/{self.total_jobs} {self.elapsed():6.0f}s] {msg}")

  def _start_gpu_state(self):
    """nvidia-smi in the background on a GPU (Options.gpu_state_ms), so that each JAX timing
    records the clock, power and throttle reasons of its interval (``gpu`` in its mode entry):
    runs of the same code on different days differed by up to 9 %, and the timing alone cannot
    say whether the clock did."""
    meta = self.doc["meta"]
    if not self.opts.gpu_state_ms or meta["platform"] != "gpu":
      meta["gpu_state"] = "off"
      return
    self._smi = SmiSampler.start(period_ms=self.opts.gpu_state_ms)
    meta["gpu_state"] = (f"nvidia-smi every {self.opts.gpu_state_ms} ms over each JAX timing's "
                         "CUPTI calls (mode entries' 'gpu')" if self._smi is not None
                         else "unavailable: no nvidia-smi")

  # ---------------------------------------------------------------- passes

  def run(self) -> dict:
    primary = [i for i in self.impls if i.kind in ("backend", "ceiling")]
    jax_baselines = [i for i in self.impls if i.kind == "baseline" and i.name != "sonicmoe-torch"]
    torch_baselines = [i for i in self.impls if i.name == "sonicmoe-torch"]
    # With a time budget every pass may run until its share of it is spent (time a pass leaves
    # unused goes to the next), so a slow pass cannot starve the baselines entirely.
    check = self.opts.check
    timed = not self.opts.check_only
    passes = [
        (primary if timed else [], self._measure_jax),
        ([i for i in primary if i.checkable] if check else [], self._check),
        (jax_baselines if timed else [], self._measure_jax),
        ([i for i in jax_baselines if i.checkable] if check else [], self._check),
        (torch_baselines if timed else [], self._measure_torch),
    ]
    if not timed:
      for row in self.doc["results"]:
        row["status"] = CHECK_ONLY
    active = [w if impls else 0 for (impls, _), w in zip(passes, PASS_WEIGHTS)]
    total, done = max(sum(active), 1), 0
    self._start_gpu_state()
    try:
      for (impls, fn), w in zip(passes, active):
        done += w
        if impls:
          self._pass(impls, fn, done / total)
    finally:
      if self._smi is not None:
        # How many samples parsed: 0 would mean nvidia-smi's output did not parse (no 'gpu'
        # entries), which a reader of the JSON must be able to tell from "not sampled".
        self.doc["meta"]["gpu_state_samples"] = len(self._smi.rows())
        self._smi.stop()
        self._smi = None
    self._ref_cache.clear()
    for row in self.doc["results"]:
      if row["status"] == "pending":
        row["status"], row["reason"] = "skipped", "skipped: time budget"
      if self.opts.check and "check" not in row:
        row["check"] = None
    self.doc["meta"]["complete"] = True
    self.doc["meta"]["elapsed_s"] = round(self.elapsed(), 1)
    self.doc["meta"]["versions"] = versions()
    self.save()
    return self.doc

  def _pass(self, impls: list[Impl], fn, share: float = 1.0):
    self._last_problem = None
    is_check = getattr(fn, "__name__", "") == "_check"
    for cfg in self.configs:
      todo = []
      for impl in impls:
        row = self.rows[(cfg.name, impl.name)]
        reason = impl.skip_reason(cfg, self.spec, self.opts)
        if reason:
          row["status"], row["reason"] = "skipped", reason
          continue
        if is_check and row["status"] not in ("ok", "partial", CHECK_ONLY):
          continue
        todo.append(impl)
      if not todo:
        continue
      for impl in todo:
        row = self.rows[(cfg.name, impl.name)]
        if self.over_budget(share):
          if is_check:
            row["check"] = {"ok": None, "reason": "skipped: time budget"}
          elif row["status"] == "pending":
            row["status"], row["reason"] = "skipped", "skipped: time budget"
          continue
        try:
          fn(impl, cfg, row)
        except Exception as e:  # noqa: BLE001 - every failure is a table entry, never a crash
          err = _short_error(e)
          if is_check:
            row["check"] = {"ok": False, "reason": f"failed: {err}"}
          else:
            row["status"] = "partial" if row["modes"] else "failed"
            row["reason"] = f"failed: {err}"
            row["traceback"] = traceback.format_exc()[-2000:]
          self.say(f"{cfg.name} {impl.name}: {err}")
        finally:
          self.jobs_done += 1
          gc.collect()
          self.save()

  # ---------------------------------------------------------------- measurements

  def _measure_jax(self, impl: Impl, cfg: BenchConfig, row: dict):
    opts = self.opts
    problem, stats = self._problem(cfg)
    row.update({k: stats[k] for k in ("pairs", "imbalance", "max_load", "empty_experts")})
    pairs = stats["pairs"] if impl.counts_routed_pairs else cfg.T * cfg.K
    row["flop_pairs"] = pairs
    layer, args = impl.prepare(problem, self.spec)
    g = problem.dout if impl.kind != "ceiling" else None
    try:
      row["saved_act_bytes"], row["saved_top"] = saved_residual_bytes(layer, args)
    except Exception as e:  # noqa: BLE001
      row["saved_act_bytes"], row["saved_note"] = None, _short_error(e)

    def fwd_train(*a):
      return jax.vjp(layer, *a)

    fwdbwd = fwdbwd_step(layer)

    if g is None:  # dense ceiling: cotangent of the (T·K, d) output
      g = jax.jit(lambda: (0.2 * jax.random.normal(jax.random.key(2), (pairs, cfg.d),
                                                    jnp.float32)).astype(problem.x.dtype))()
    modes = opts.modes
    want_fwd = "fwd" in modes or ("bwd" in modes and not opts.bwd_direct)
    want_fwdbwd = "fwdbwd" in modes or ("bwd" in modes and not opts.bwd_direct)
    results = row["modes"]
    if want_fwd:
      results["fwd"] = self._mode_entry("fwd", self._time(training_forward(layer), args), pairs,
                                        cfg)
      self._say_mode(cfg, impl, "fwd", results["fwd"])
    if "bwd" in modes and opts.bwd_direct:
      vjp_fn = jax.jit(fwd_train)(*args)[1]
      bargs = (vjp_fn, g)
      results["bwd"] = self._mode_entry("bwd", self._time(lambda f, gg: f(gg), bargs), pairs,
                                        cfg)
      results["bwd"]["method"] = "direct"
      del vjp_fn, bargs
      self._say_mode(cfg, impl, "bwd", results["bwd"])
    if want_fwdbwd:
      fargs = (*args, g)
      results["fwdbwd"] = self._mode_entry("fwdbwd", self._time(fwdbwd, fargs), pairs, cfg)
      self._say_mode(cfg, impl, "fwd+bwd", results["fwdbwd"])
    if "bwd" in modes and not opts.bwd_direct:
      f, fb = results["fwd"], results["fwdbwd"]
      ms = fb["ms"] - f["ms"]
      results["bwd"] = {"ms": ms, "tflops": flops("bwd", pairs, cfg.d, cfg.n) / ms / 1e9
                        if ms > 0 else None, "timer": fb["timer"],
                        "method": "(fwd+bwd) - fwd"}
    if "fwd" not in modes:
      results.pop("fwd", None)
    if "fwdbwd" not in modes:
      results.pop("fwdbwd", None)
    row["process_peak_bytes"] = (memory_stats() or {}).get("peak_bytes_in_use")
    row["status"], row["reason"] = "ok", None

  def _problem(self, cfg: BenchConfig):
    """Inputs and routing statistics of ``cfg``, shared by the implementations in a pass."""
    if self._last_problem is None or self._last_problem[0] != cfg.name:
      self._last_problem = None
      gc.collect()
      problem = make_problem(cfg, seed=self.opts.seed)
      self._last_problem = (cfg.name, problem, routing_stats(problem, self.spec))
    return self._last_problem[1], self._last_problem[2]

  def _time(self, fn, args) -> Measured:
    return compile_and_time(fn, args, iters=self.opts.iters, warmup=self.opts.warmup,
                            wall_too=True, keep_out=False)

  def _mode_entry(self, mode, m: Measured, pairs, cfg) -> dict:
    tm, c, first = m.timing, m.compiled, m.first_call_s
    gpu = None
    if self._smi is not None and tm.window is not None:
      gpu = self._smi.interval(*tm.window)
    return {"ms": tm.median_ms, "tflops": flops(mode, pairs, cfg.d, cfg.n) / tm.median_ms / 1e9,
            "timer": tm.timer, "wall_ms": tm.wall_median_ms, "compile_s": c.compile_s,
            "first_call_s": first, "samples_ms": [round(s, 5) for s in tm.samples_ms],
            "footprint_bytes": (c.memory or {}).get("footprint_bytes"),
            "temp_bytes": (c.memory or {}).get("temp_size_in_bytes"),
            "argument_bytes": (c.memory or {}).get("argument_size_in_bytes"),
            **({"timer_note": tm.note} if tm.note else {}),
            **({"gpu": gpu} if gpu is not None else {})}

  def _say_mode(self, cfg, impl, label, e):
    gpu = e.get("gpu")
    clock = ""
    if gpu:
      num = lambda v: "?" if v is None else f"{v:.0f}"  # noqa: E731
      clock = (f", SM {num(gpu['sm_mhz'])} MHz, {num(gpu['power_w'])} W, "
               f"{'/'.join(gpu['reasons'])}")
    self.say(f"{cfg.name:<22} {impl.name:<16} {label:<8} {e['ms']:9.3f} ms "
             f"{e['tflops']:7.1f} TF/s  (compile {e['compile_s']:.1f} s, {e['timer']}{clock})")

  def _check(self, impl: Impl, cfg: BenchConfig, row: dict):
    if impl.name == "xla":
      row["check"] = {"ok": True, "reason": "reference"}
      return
    row["check"] = res = check_against_xla(impl, cfg, self.spec, self.opts, self._ref_cache)
    self.say(f"{cfg.name:<22} {impl.name:<16} check at T={res['T']} E={res['E']} "
             f"K={res['K']}: max rel err "
             f"{res['max_rel_err']:.2e} {'ok' if res['ok'] else 'FAIL'}")

  def _measure_torch(self, impl, cfg: BenchConfig, row: dict):
    opts = self.opts
    res = impl.measure(cfg, opts.modes, opts.warmup, opts.iters)
    pairs = cfg.T * cfg.K
    row["flop_pairs"] = pairs
    results = row["modes"]
    for mode in ("fwd", "fwdbwd"):
      if mode in res:
        ms = res[mode]["ms"]
        results[mode] = {"ms": ms, "tflops": flops(mode, pairs, cfg.d, cfg.n) / ms / 1e9,
                         "timer": res["timer"], "first_call_s": res[mode]["first_call_s"],
                         "samples_ms": [round(s, 5) for s in res[mode]["samples_ms"]]}
        self._say_mode(cfg, impl, mode, {**results[mode], "compile_s": res[mode]["first_call_s"]})
    if "fwd" in results and "fwdbwd" in results and "bwd" in opts.modes:
      ms = results["fwdbwd"]["ms"] - results["fwd"]["ms"]
      results["bwd"] = {"ms": ms, "tflops": flops("bwd", pairs, cfg.d, cfg.n) / ms / 1e9
                        if ms > 0 else None, "timer": res["timer"], "method": "(fwd+bwd) - fwd"}
    for mode in ("fwd", "fwdbwd"):
      if mode not in opts.modes:
        results.pop(mode, None)
    row["torch_peak_extra_bytes"] = res.get("peak_extra_bytes")
    row["torch_autotuning"] = res.get("autotuning")
    row["status"], row["reason"] = "ok", None


def _json_default(o):
  if isinstance(o, (np.integer,)):
    return int(o)
  if isinstance(o, (np.floating,)):
    return float(o)
  return str(o)
