"""Benchmark problem sizes: the paper's 12 configs, real-model presets, CPU smoke sizes.

A config is (T, d, n, E, K): T tokens, model width d, expert intermediate size n, E experts,
top-K. The paper's configs are SonicMoE Fig. 14 (H100), with its SonicMoE fwd / bwd TFLOP/s
read from the figure (``sonicmoe-spec.md`` §7.2), kept here so every report can print them next
to ours. Presets take d, n, E, K from the models' published configs; T is ours (see PRESETS).
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """One MoE layer problem. ``paper_tflops`` = (fwd, bwd) of SonicMoE on an H100, if any."""

  name: str
  T: int
  d: int
  n: int
  E: int
  K: int
  source: str = "command line"
  paper_tflops: tuple[float, float] | None = None
  # The original PyTorch SonicMoE measured on one H200 (sonicmoe-spec.md §7.2b): fwd, fwd+bwd.
  sonic_h200_tflops: tuple[float, float] | None = None

  def __post_init__(self):
    for field in ("T", "d", "n", "E", "K"):
      v = getattr(self, field)
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"BenchConfig.{field} must be a positive int, got {v!r}")
    if self.K > self.E:
      raise ValueError(f"BenchConfig.K must be <= E ({self.E}), got {self.K}")

  @property
  def shape(self) -> tuple[int, int, int, int, int]:
    return (self.T, self.d, self.n, self.E, self.K)

  def scaled(self, T: int, suffix: str = "") -> "BenchConfig":
    """The same layer with T tokens (for correctness checks at reference-friendly sizes)."""
    return dataclasses.replace(self, name=self.name + suffix, T=T, paper_tflops=None,
                               sonic_h200_tflops=None)


def flops(mode: str, pairs: int, d: int, n: int) -> float:
  """The paper's count for a SwiGLU expert block: fwd 6, bwd 12, fwd+bwd 18 · pairs · d · n.

  ``pairs`` is T·K for top-K routing, the number of kept pairs with token rounding. Router,
  gather and combine are not counted (as in the paper).
  """
  factor = {"fwd": 6, "bwd": 12, "fwdbwd": 18}.get(mode)
  if factor is None:
    raise ValueError(f"mode must be 'fwd', 'bwd' or 'fwdbwd', got {mode!r}")
  return float(factor) * pairs * d * n


# The original SonicMoE (0.1.2.post1) on one H200, 2026-12-02 (spec §7.2b): fwd, fwd+bwd TF/s.
_SONIC_H200 = {(24576, 1536, 256, 128, 8): (240, 303), (24576, 1536, 1024, 32, 2): (265, 278),
               (32768, 4096, 256, 256, 16): (463, 414), (32768, 4096, 1024, 128, 8): (564, 537)}


def _paper(label, T, d, n, E, K, fwd, bwd):
  return BenchConfig(f"paper-{label}-n{n}", T, d, n, E, K,
                     source="SonicMoE paper Fig. 14 (H100)", paper_tflops=(fwd, bwd),
                     sonic_h200_tflops=_SONIC_H200.get((T, d, n, E, K)))


# SonicMoE Fig. 14: (model, T, d, n, E, K, SonicMoE fwd TF/s, bwd TF/s on an H100).
PAPER_CONFIGS: tuple[BenchConfig, ...] = (
    _paper("1.4B", 40960, 768, 256, 128, 8, 335, 363),
    _paper("1.4B", 40960, 768, 512, 64, 4, 397, 401),
    _paper("1.4B", 40960, 768, 1024, 32, 2, 403, 433),
    _paper("7B", 24576, 1536, 256, 128, 8, 363, 403),
    _paper("7B", 24576, 1536, 512, 64, 4, 431, 437),
    _paper("7B", 24576, 1536, 1024, 32, 2, 463, 465),
    _paper("30B", 32768, 4096, 256, 256, 16, 428, 460),
    _paper("30B", 32768, 4096, 512, 128, 8, 503, 511),
    _paper("30B", 32768, 4096, 1024, 64, 4, 552, 554),
    _paper("120B", 32768, 4096, 512, 256, 16, 518, 526),
    _paper("120B", 32768, 4096, 1024, 128, 8, 558, 567),
    _paper("120B", 32768, 4096, 2048, 64, 4, 595, 586),
)

# Real models (routed experts only; shared experts and dense layers are not part of the block).
# T = 16384 tokens per layer call for every preset: a typical training microbatch (e.g. 4 × 4096
# or 8 × 2048 tokens), between the paper's 24K-41K and what the largest preset (DeepSeek-V3-like:
# 22.5 GiB of bf16 expert weights, 45 GiB of fp32 weight gradients) needs to stay well inside one
# H200 next to the baselines.
PRESET_T = 16384
PRESETS: tuple[BenchConfig, ...] = (
    # allenai/OLMoE-1B-7B: hidden 2048, intermediate 1024, 64 experts, top-8.
    BenchConfig("OLMoE-1B-7B", PRESET_T, 2048, 1024, 64, 8, source="OLMoE-1B-7B config"),
    # Qwen/Qwen3-30B-A3B: hidden 2048, moe_intermediate 768, 128 experts, top-8.
    BenchConfig("Qwen3-30B-A3B", PRESET_T, 2048, 768, 128, 8, source="Qwen3-30B-A3B config"),
    # deepseek-ai/DeepSeek-V3: hidden 7168, moe_intermediate 2048, 256 routed experts, top-8
    # (its shared expert and group-limited routing are left out: "-like").
    BenchConfig("DeepSeek-V3-like", PRESET_T, 7168, 2048, 256, 8,
                source="DeepSeek-V3 config (routed experts)"),
    # mistralai/Mixtral-8x7B: hidden 4096, intermediate 14336, 8 experts, top-2.
    BenchConfig("Mixtral-8x7B", PRESET_T, 4096, 14336, 8, 2, source="Mixtral-8x7B config"),
)

# CPU smoke sizes: a handful of tiles, E not a power of two, K > 1.
TINY_CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("tiny-a", 64, 64, 64, 6, 2, source="CPU smoke test"),
    BenchConfig("tiny-b", 128, 128, 64, 8, 4, source="CPU smoke test"),
)

GROUPS: dict[str, tuple[BenchConfig, ...]] = {
    "paper": PAPER_CONFIGS, "presets": PRESETS, "tiny": TINY_CONFIGS,
    "all": PAPER_CONFIGS + PRESETS,
}

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*$")


def by_name() -> dict[str, BenchConfig]:
  out = {}
  for group in (PAPER_CONFIGS, PRESETS, TINY_CONFIGS):
    for c in group:
      out[c.name.lower()] = c
  return out


def parse_configs(specs: list[str] | str) -> list[BenchConfig]:
  """Configs from names, group names (paper, presets, tiny, all) or 'T,d,n,E,K' tuples.

  Specs may be given as a list or one string separated by ';' or whitespace. Duplicates are
  dropped (first occurrence wins). Raises ValueError naming the bad spec.
  """
  if isinstance(specs, str):
    specs = [specs]
  tokens = []
  for s in specs:
    tokens += [t for t in re.split(r"[;\s]+", s) if t]
  names = by_name()
  out: list[BenchConfig] = []
  for tok in tokens:
    key = tok.lower()
    if key in GROUPS:
      out += GROUPS[key]
    elif key in names:
      out.append(names[key])
    elif m := _SHAPE_RE.match(tok):
      T, d, n, E, K = (int(g) for g in m.groups())
      out.append(BenchConfig(f"T{T}-d{d}-n{n}-E{E}-K{K}", T, d, n, E, K))
    else:
      raise ValueError(
          f"config {tok!r} is neither a group ({', '.join(GROUPS)}), a config name "
          f"({', '.join(sorted(names))}) nor 'T,d,n,E,K'")
  seen, unique = set(), []
  for c in out:
    if c.name not in seen:
      seen.add(c.name)
      unique.append(c)
  return unique
