"""``--isolate``: every implementation in its own process.

A kernel that corrupts the CUDA context (an illegal address, say) or exhausts memory then costs
only its own rows, every implementation starts from a clean device (its process peak memory is its
own), and the parent never runs anything on the GPU. The parent hands each child its share of the
time budget (backends + ceiling first, then the JAX baselines, then the PyTorch SonicMoE) and
merges the children's rows into one document; a child that dies leaves its measured rows and
"failed: ..." for the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sonic_jax.bench.runner import Runner

# Shares of the budget per group: backends + ceiling (with checks), JAX baselines (with
# checks), PyTorch SonicMoE. Renormalized over the groups that have something to run.
GROUP_WEIGHTS = (68, 24, 8)
CHILD_GRACE_S = 90   # a child may finish the job it started after its budget
MIN_CHILD_S = 10     # below this a child is not started
_FIRST = {"xla": 0, "lax-ragged": 0, "dense-ceiling": 1}


def _group(impl) -> int:
  if impl.kind in ("backend", "ceiling"):
    return 0
  return 2 if impl.name == "sonicmoe-torch" else 1


def run_isolated(runner: Runner, base_argv: list[str], work_dir: str) -> dict:
  opts, spec = runner.opts, runner.spec
  budget = opts.time_budget_s
  os.makedirs(work_dir, exist_ok=True)
  groups: list[list] = [[], [], []]
  for impl in runner.impls:
    reasons = {cfg.name: impl.skip_reason(cfg, spec, opts) for cfg in runner.configs}
    for cfg_name, reason in reasons.items():
      if reason:
        row = runner.rows[(cfg_name, impl.name)]
        row["status"], row["reason"] = "skipped", reason
    if any(r is None for r in reasons.values()):
      groups[_group(impl)].append(impl)
    else:
      runner.say(f"{impl.name}: nothing to run ({next(iter(reasons.values()))})")
  runner.save()
  # Cheap ones first (xla and lax.ragged_dot run only where they fit, the dense ceiling is two
  # XLA GEMMs): whatever they leave of their share goes to the kernels after them.
  for g in groups:
    g.sort(key=lambda i: _FIRST.get(i.name, 9))
  weights = [w if g else 0 for g, w in zip(groups, GROUP_WEIGHTS)]
  total, done = max(sum(weights), 1), 0
  for impls, w in zip(groups, weights):
    done += w
    deadline = None if budget is None else budget * done / total
    for k, impl in enumerate(impls):
      child_budget = None
      if deadline is not None:
        child_budget = (deadline - runner.elapsed()) / (len(impls) - k)
        if child_budget < MIN_CHILD_S:
          _finish_rows(runner, impl.name, "skipped: time budget")
          continue
      _run_child(runner, impl, base_argv, work_dir, child_budget)
      runner.save()
  for row in runner.doc["results"]:
    if row["status"] == "pending":
      row["status"], row["reason"] = "skipped", "skipped: time budget"
  runner.doc["meta"]["complete"] = True
  runner.doc["meta"]["isolated"] = True
  runner.doc["meta"]["elapsed_s"] = round(runner.elapsed(), 1)
  runner.save()
  return runner.doc


def _finish_rows(runner: Runner, impl_name: str, reason: str) -> None:
  for (cfg_name, name), row in runner.rows.items():
    if name == impl_name and row["status"] == "pending":
      row["status"], row["reason"] = ("failed" if reason.startswith("failed") else "skipped",
                                      reason)


def _run_child(runner: Runner, impl, base_argv, work_dir, child_budget) -> None:
  json_path = os.path.join(work_dir, f"part-{impl.name}.json")
  if os.path.exists(json_path):
    os.remove(json_path)
  which = (["--backends", impl.name, "--baselines", "none"] if impl.kind == "backend"
           else ["--backends", "none", "--baselines", impl.name])
  argv = [*base_argv, *which, "--json-path", json_path, "--json-only"]
  if child_budget is not None:
    argv += ["--time-budget-s", f"{child_budget:.0f}"]
  runner.say(f"{impl.name}: child process"
             + (f", budget {child_budget:.0f} s" if child_budget is not None else ""))
  t0 = time.perf_counter()
  try:
    proc = subprocess.run([sys.executable, "-m", "sonic_jax.bench", *argv],
                          timeout=None if child_budget is None else child_budget + CHILD_GRACE_S)
    outcome = None if proc.returncode == 0 else f"failed: its process exited with code {proc.returncode}"
  except subprocess.TimeoutExpired:
    outcome = f"failed: its process was stopped after {time.perf_counter() - t0:.0f} s"
  try:
    with open(json_path) as f:
      child = json.load(f)
  except (OSError, ValueError):
    child = None
  if child is not None:
    for row in child["results"]:
      key = (row["config"], row["impl"])
      if key in runner.rows and row["impl"] == impl.name:
        if row["status"] == "pending":
          row["status"], row["reason"] = "failed", outcome or "failed: not finished"
        runner.rows[key].clear()
        runner.rows[key].update(row)
    runner.doc["meta"]["versions"].update(child["meta"].get("versions", {}))
    timing = child["meta"].get("timing")
    if timing:
      runner.doc["meta"]["timing"] = timing
  _finish_rows(runner, impl.name, outcome or "failed: no result from its process")
