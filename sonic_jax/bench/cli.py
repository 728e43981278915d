"""``python -m sonic_jax.bench``: time every backend and baseline on MoE layer configs.

Examples:
  python -m sonic_jax.bench                                   # GPU: paper configs + presets
  python -m sonic_jax.bench --configs tiny --backends xla     # CPU smoke run
  python -m sonic_jax.bench --configs 16384,2048,1024,64,8 --routing tr --dist zipf
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys

from sonic_jax.bench.configs import GROUPS, parse_configs
from sonic_jax.bench.impls import BASELINES
from sonic_jax.bench.problems import RoutingSpec
from sonic_jax.bench.report import terminal_table, write_outputs
from sonic_jax.bench.runner import MODES, Options, Runner
from sonic_jax.bench.timing import device_label, on_gpu


def _csv(s: str) -> list[str]:
  return [t.strip() for t in s.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
      prog="python -m sonic_jax.bench", description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--configs", nargs="+", default=None,
                  help=f"groups ({', '.join(GROUPS)}), config names or T,d,n,E,K "
                       "(default: 'all' on a GPU, 'tiny' elsewhere)")
  ap.add_argument("--backends", default="auto",
                  help="comma list of xla, pallas, ffi, the backends.COMBINED names "
                       "(pallas+ffi, pallas+ffi-wgrad), pallas-interpret, or 'auto' (default: "
                       "all but pallas-interpret; those that cannot run here are reported with "
                       "the reason), or 'none'")
  ap.add_argument("--baselines", default="all",
                  help=f"comma list of {', '.join(BASELINES)}, or 'all' (default) or 'none'")
  ap.add_argument("--routing", choices=("topk", "tr"), default="topk",
                  help="top-K routing or tile-aware token rounding")
  ap.add_argument("--routing-impl", default="auto",
                  help="top-K routing implementation of the timed layers: auto (default, the "
                       "layer's default: Triton kernels on GPUs), xla, jax_triton, pallas_triton")
  ap.add_argument("--tile", type=int, default=128, help="token-rounding tile (default 128)")
  ap.add_argument("--rounding", choices=("nearest", "up", "down"), default="nearest")
  ap.add_argument("--dist", choices=("uniform", "zipf"), default="uniform",
                  help="router logit distribution: uniform, or zipf (deterministic bias "
                       "-s·log(1+e))")
  ap.add_argument("--zipf-s", type=float, default=1.2, help="Zipf exponent s (default 1.2)")
  ap.add_argument("--modes", default=",".join(MODES), help="comma list of fwd, bwd, fwdbwd")
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--bwd-direct", action="store_true",
                  help="time the backward alone (default: (fwd+bwd) - fwd, like the paper)")
  ap.add_argument("--no-check", action="store_true", help="skip the checks against xla")
  ap.add_argument("--check-only", action="store_true",
                  help="only the checks against xla, no timing (merge adds them to timed rows)")
  ap.add_argument("--check-budget-gib", type=float, default=2.0,
                  help="GPU memory the xla reference may densify into for the check")
  ap.add_argument("--check-tol", type=float, default=3e-2)
  ap.add_argument("--dense-ref-budget-gib", type=float, default=8.0,
                  help="largest densified temporary for timing xla / lax.ragged_dot on a GPU")
  ap.add_argument("--time-budget-s", type=float, default=None,
                  help="stop starting new measurements after this many seconds")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--gpu-state-ms", type=int, default=50,
                  help="on a GPU, sample nvidia-smi this often and record each timing's SM "
                       "clock, power and throttle reasons (0: off)")
  ap.add_argument("--out-dir", default=os.path.join("benchmarks", "results"))
  ap.add_argument("--name", default="bench", help="file name prefix (default 'bench')")
  ap.add_argument("--tag", default="", help="extra suffix for the file names")
  ap.add_argument("--no-plots", action="store_true")
  ap.add_argument("--quiet", action="store_true", help="no progress lines")
  ap.add_argument("--isolate", action="store_true",
                  help="run every implementation in its own process (a crash or a poisoned "
                       "CUDA context costs only its rows)")
  ap.add_argument("--json-path", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
  return ap


def resolve_impls(backends: str, baselines: str) -> list[str]:
  from sonic_jax.backends import NAMES
  if backends == "auto":
    names = list(NAMES)  # the unavailable ones get a row that says why
  elif backends == "none":
    names = []
  else:
    names = _csv(backends)
  if baselines == "all":
    names += list(BASELINES)
  elif baselines != "none":
    names += _csv(baselines)
  if not names:
    raise ValueError("nothing to run: --backends and --baselines are both empty")
  return list(dict.fromkeys(names))


def output_stem(out_dir: str, name: str, spec: RoutingSpec, tag: str = "") -> str:
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  stem = f"{name}-{device_label()}-{date}"
  if spec.label != "topk":
    stem += f"-{spec.label}"
  if tag:
    stem += f"-{tag}"
  return os.path.join(out_dir, stem)


def main(argv: list[str] | None = None) -> int:
  ap = build_parser()
  args = ap.parse_args(argv)
  try:
    configs = parse_configs(args.configs or (["all"] if on_gpu() else ["tiny"]))
    spec = RoutingSpec(method=args.routing, dist=args.dist, zipf_s=args.zipf_s,
                       tile=args.tile, rounding_mode=args.rounding,
                       route_impl=args.routing_impl)
    opts = Options(warmup=args.warmup, iters=args.iters, modes=tuple(_csv(args.modes)),
                   bwd_direct=args.bwd_direct, check=not args.no_check,
                   check_budget_gib=args.check_budget_gib, check_tol=args.check_tol,
                   dense_ref_budget_gib=args.dense_ref_budget_gib,
                   time_budget_s=args.time_budget_s, seed=args.seed,
                   check_only=args.check_only, gpu_state_ms=args.gpu_state_ms)
    impls = resolve_impls(args.backends, args.baselines)
  except ValueError as e:
    ap.error(str(e))
  stem = output_stem(args.out_dir, args.name, spec, args.tag)
  raw_argv = list(sys.argv[1:] if argv is None else argv)
  command = "python -m sonic_jax.bench " + " ".join(shlex.quote(a) for a in raw_argv)
  progress = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
  json_path = args.json_path or stem + ".json"
  if not args.json_only:
    progress(f"sonic_jax.bench: {len(configs)} configs x {len(impls)} implementations "
             f"({', '.join(impls)}), routing {spec.label}, results -> {stem}.*")
  runner = Runner(configs, impls, spec, opts, json_path=json_path, progress=progress,
                  command=command)
  if args.isolate and not args.json_only:
    from sonic_jax.bench.isolate import run_isolated
    import tempfile
    child_argv = [a for a in raw_argv if a != "--isolate"]
    with tempfile.TemporaryDirectory(prefix="sonic_jax_bench_") as work_dir:
      doc = run_isolated(runner, child_argv, work_dir)
  else:
    doc = runner.run()
  if args.json_only:
    return 0
  print()
  print(terminal_table(doc))
  print()
  for p in write_outputs(doc, stem, make_plots=not args.no_plots):
    print("wrote", p)
  return 0
