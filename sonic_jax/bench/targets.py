"""The issues' forward+backward speed targets, scored from a results document.

For each sonic_jax GPU backend with measured rows, and for ``auto`` (per config, the row of the
backend that ``sonic_jax.auto_order(d, n)`` puts first among those measured: what
``backend="auto"`` runs there, derived, not a separate run):

* f+b against the paper's H100 SonicMoE: the paper gives forward and backward TFLOP/s, so its
  f+b is 18 / (6 / fwd + 12 / bwd) (the same FLOP count: time-weighted);
* f+b against the original SonicMoE measured on the same GPU (the ``sonicmoe-torch`` rows),
  at 1.0x and 1.1x.

Rows timed on the gradients-only step (``merge.OLD_STEP``) overstate f+b and are not scored.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from sonic_jax.backends import auto_order
from sonic_jax.bench.merge import OLD_STEP

ORIGINAL = "sonicmoe-torch"
# (label, reference, factor): f+b / reference >= factor counts as met.
TARGETS = (("f+b ≥ the paper's H100 SonicMoE", "paper", 1.0),
           ("f+b ≥ the original SonicMoE on this GPU", "original", 1.0),
           ("f+b ≥ 1.1× the original on this GPU", "original", 1.1))


def paper_fwdbwd(paper_tflops) -> float | None:
  """The paper's forward+backward TFLOP/s from its (forward, backward) pair."""
  if not paper_tflops:
    return None
  fwd, bwd = paper_tflops
  return 18.0 / (6.0 / fwd + 12.0 / bwd)


def fwdbwd_tflops(row) -> float | None:
  """A result row's forward+backward TFLOP/s, or None where it did not run or was timed on the
  old gradients-only step."""
  if row is None or row.get("status") not in ("ok", "partial"):
    return None
  if row.get("fwdbwd_step") == OLD_STEP:
    return None
  return ((row.get("modes") or {}).get("fwdbwd") or {}).get("tflops")


@dataclasses.dataclass
class Score:
  """One target for one implementation: the ratio per scored config, and the misses."""

  label: str
  factor: float
  ratios: dict[str, float]

  @property
  def met(self) -> int:
    return sum(r >= self.factor for r in self.ratios.values())

  def misses(self) -> dict[str, float]:
    return {c: r for c, r in self.ratios.items() if r < self.factor}

  def cell(self) -> str:
    if not self.ratios:
      return "–"
    out = f"{self.met} of {len(self.ratios)}"
    miss = self.misses()
    if miss:
      out += " (" + ", ".join(f"{c.removeprefix('paper-')} {r:.3f}×" for c, r in miss.items()) + ")"
    return out


def backends_measured(doc: dict) -> list[str]:
  """The sonic_jax GPU backends (not the xla reference) with at least one scored row."""
  names = dict.fromkeys(r["impl"] for r in doc["results"]
                        if r.get("kind") == "backend" and r["impl"] != "xla")
  return [n for n in names if any(fwdbwd_tflops(r) for r in doc["results"] if r["impl"] == n)]


def scorecard(doc: dict, order: Callable[[int, int], tuple[str, ...]] = auto_order
              ) -> dict[str, list[Score]]:
  """impl (each measured backend, then "auto" where two or more are) -> one Score per TARGETS
  entry, over the configs where both the impl's f+b and the reference exist."""
  configs = list(dict.fromkeys(r["config"] for r in doc["results"]))
  by = {(r["config"], r["impl"]): r for r in doc["results"]}
  shape = {r["config"]: (r["d"], r["n"]) for r in doc["results"]}
  impls = backends_measured(doc)

  def value(config: str, impl: str) -> float | None:
    if impl != "auto":
      return fwdbwd_tflops(by.get((config, impl)))
    for name in order(*shape[config]):
      if name in impls and fwdbwd_tflops(by.get((config, name))):
        return fwdbwd_tflops(by[(config, name)])
    return None

  def reference(config: str, kind: str) -> float | None:
    rows = [r for r in doc["results"] if r["config"] == config]
    if kind == "paper":
      return paper_fwdbwd(rows[0].get("paper_tflops")) if rows else None
    return fwdbwd_tflops(by.get((config, ORIGINAL)))

  out = {}
  for impl in impls + (["auto"] if len(impls) > 1 else []):
    scores = []
    for label, kind, factor in TARGETS:
      ratios = {}
      for c in configs:
        v, ref = value(c, impl), reference(c, kind)
        if v and ref:
          ratios[c] = v / ref
      scores.append(Score(label, factor, ratios))
    out[impl] = scores
  return out


def markdown(doc: dict) -> list[str]:
  """A table of the targets (rows) by implementation (columns), or [] with nothing to score."""
  card = scorecard(doc)
  if not any(s.ratios for scores in card.values() for s in scores):
    return []
  impls = list(card)
  lines = ["| target (misses: ratio) | " + " | ".join(f"`{i}`" for i in impls) + " |",
           "| --- |" + " --- |" * len(impls)]
  for t, (label, _, _) in enumerate(TARGETS):
    lines.append(f"| {label} | " + " | ".join(card[i][t].cell() for i in impls) + " |")
  return lines
