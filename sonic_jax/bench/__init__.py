"""Benchmarks for sonic_jax: ``python -m sonic_jax.bench`` and the same pieces as a library.

``configs`` (paper configs, model presets, parsing), ``problems`` (inputs, routing, the timed
layer), ``impls`` (backends, baselines, dense ceiling), ``runner`` (measurement), ``report``
(table, Markdown, plots) and ``readme`` (the README performance section from recorded results).
"""

from sonic_jax.bench.configs import (GROUPS, PAPER_CONFIGS, PRESETS, TINY_CONFIGS, BenchConfig,
                                     flops, parse_configs)
from sonic_jax.bench.problems import RoutingSpec, make_problem
from sonic_jax.bench.runner import Options, Runner


def run(configs, impls, spec: RoutingSpec | None = None, opts: Options | None = None,
        json_path: str | None = None, progress=print) -> dict:
  """Runs ``impls`` (names) on ``configs`` (BenchConfigs or specs); returns the results doc."""
  if not all(isinstance(c, BenchConfig) for c in configs):
    configs = parse_configs([c if isinstance(c, str) else c.name for c in configs])
  runner = Runner(list(configs), list(impls), spec or RoutingSpec(), opts or Options(),
                  json_path=json_path, progress=progress)
  return runner.run()


__all__ = ["BenchConfig", "GROUPS", "Options", "PAPER_CONFIGS", "PRESETS", "RoutingSpec",
           "Runner", "TINY_CONFIGS", "flops", "make_problem", "parse_configs", "run"]
