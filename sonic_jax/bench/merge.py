"""Merges benchmark runs into one results document.

A device call lasts at most ten minutes, so a full run of every backend and baseline may be
split over calls (``--backends ... --baselines none`` in one, ``--backends none --baselines
...`` in another). ``python -m sonic_jax.bench.merge OUT.json RUN1.json RUN2.json ...`` keeps,
for every (config, impl), the row of the LAST run that measured it (status ok/partial; else the
last run's row), marks each row with the file it came from and with what its timed fwd+bwd
step returned (``fwdbwd_step``: runs before that key existed timed the gradients alone), and
records the sources in
``meta["merged_from"]`` (``sonic_jax.bench.readme`` then shows only the merged document). A
``--check-only`` run's check is added to the row it checks (``check_source`` names its file).
Runs must share routing and device. ``--extend OLD_MERGED.json`` puts the runs an earlier
merge was made of (from its ``merged_from``, in its directory) before the given runs, so that a
new run joins the table without retyping the list; the earlier merge's own notes are printed,
not carried (restate the ones that still hold with ``--note``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os

from sonic_jax.bench import report
from sonic_jax.bench.runner import CHECK_ONLY, FWDBWD_STEP

_MEASURED = ("ok", "partial")
# Runs recorded before meta["fwdbwd_step"] existed timed the JAX rows' fwd+bwd on the gradients
# alone (XLA dropped the forward's down projection and combine); the PyTorch SonicMoE baseline
# always ran the whole step (``moe(x).backward()``).
OLD_STEP = "grads-only"
# Session 10's first runs: output and gradients, but the cotangent did not wait for the output
# (timings stand; memory may hold the forward's (T·K, d) Y at the backward's peak).
UNORDERED_STEP = "output+grads"
_WHOLE_STEP_ALWAYS = ("sonicmoe-torch",)


def row_step(row: dict, meta: dict) -> str:
  """What ``row``'s timed fwd+bwd step did: the row's own mark (a merged row), else its run's
  meta["fwdbwd_step"], else (older runs) OLD_STEP, or FWDBWD_STEP for the PyTorch baseline."""
  step = row.get("fwdbwd_step") or meta.get("fwdbwd_step")
  if step:
    return step
  return FWDBWD_STEP if row.get("impl") in _WHOLE_STEP_ALWAYS else OLD_STEP


def merge(docs: list[tuple[str, dict]]) -> dict:
  """docs: [(path, doc)] oldest first. Returns the merged document."""
  if not docs:
    raise ValueError("merge needs at least one results document")
  first = docs[0][1]["meta"]
  for path, doc in docs[1:]:
    m = doc["meta"]
    for key in ("routing", "device_kind", "platform"):
      if m.get(key) != first.get(key):
        raise ValueError(f"{path}: meta {key!r} is {m.get(key)!r}, but {docs[0][0]} has "
                         f"{first.get(key)!r}; only runs of one routing on one device merge")
  rows: dict[tuple[str, str], dict] = {}
  for path, doc in docs:
    for row in doc["results"]:
      key = (row["config"], row["impl"])
      row = dict(row, source=os.path.basename(path), fwdbwd_step=row_step(row, doc["meta"]))
      old = rows.get(key)
      if row["status"] == CHECK_ONLY and old is not None:
        if (row.get("check") or {}).get("ok") is not None:  # ran (passed or failed)
          rows[key] = dict(old, check=row["check"], check_source=row["source"])
      elif old is None or row["status"] in _MEASURED or old["status"] not in _MEASURED:
        rows[key] = row
  newest = copy.deepcopy(docs[-1][1]["meta"])
  newest["merged_from"] = [
      {"file": os.path.basename(p), "date": d["meta"].get("date"),
       "command": d["meta"].get("command")} for p, d in docs]
  newest["command"] = " ; ".join(f"[{os.path.basename(p)}] {d['meta'].get('command')}"
                                 for p, d in docs)
  notes = []
  for p, d in docs:
    notes += [f"[{os.path.basename(p)}] {n}" for n in d["meta"].get("notes", [])]
  newest["notes"] = notes
  newest["complete"] = all(d["meta"].get("complete") for _, d in docs)
  # Configs in first-seen order, implementations in first-seen order within each.
  order = list(dict.fromkeys(r["config"] for _, d in docs for r in d["results"]))
  impls = list(dict.fromkeys(r["impl"] for _, d in docs for r in d["results"]))
  results = [rows[(c, i)] for c in order for i in impls if (c, i) in rows]
  return {"meta": newest, "results": results}


def extended_runs(merged_path: str) -> list[str]:
  """The run files an earlier merge was made of, oldest first (paths beside it); prints the
  merge's own notes (those not carried from a run) for the caller to restate."""
  with open(merged_path) as f:
    meta = json.load(f)["meta"]
  if not meta.get("merged_from"):
    raise SystemExit(f"--extend {merged_path}: not a merged document (no meta['merged_from'])")
  base = os.path.dirname(os.path.abspath(merged_path))
  paths = [os.path.join(base, m["file"]) for m in meta["merged_from"]]
  missing = [p for p in paths if not os.path.exists(p)]
  if missing:
    raise SystemExit(f"--extend {merged_path}: its runs {missing} are not beside it")
  for note in meta.get("notes", []):
    if not note.startswith("["):
      print(f"(not carried from {os.path.basename(merged_path)}) {note}")
  return paths


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m sonic_jax.bench.merge", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("out", help="merged results JSON to write (Markdown and plots beside it)")
  ap.add_argument("runs", nargs="+", help="results JSONs, oldest first")
  ap.add_argument("--extend", metavar="MERGED_JSON",
                  help="an earlier merge whose runs come before RUNS")
  ap.add_argument("--note", action="append", default=[],
                  help="a note on the merged document (repeatable)")
  ap.add_argument("--no-plots", action="store_true")
  args = ap.parse_args(argv)
  paths = list(args.runs)
  if args.extend:
    paths = extended_runs(args.extend) + paths
  docs = []
  for p in paths:
    with open(p) as f:
      docs.append((p, json.load(f)))
  doc = merge(docs)
  doc["meta"]["notes"] = list(args.note) + doc["meta"]["notes"]
  stem = args.out[:-5] if args.out.endswith(".json") else args.out
  print(report.terminal_table(doc))
  for p in report.write_outputs(doc, stem, make_plots=not args.no_plots):
    print("wrote", p)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
