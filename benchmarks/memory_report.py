"""Where a layer step's memory goes: XLA's buffer assignment of one forward+backward step.

For each config and each backend variant, compiles the step the layer benchmark measures
(``sonic_jax.bench.runner.fwdbwd_step`` of ``sonic_jax.moe``: its output and its backward with a
cotangent), prints the bytes above
weights and inputs (temporaries + outputs, the benchmark's "GiB" column) and the largest slices
of XLA's temporary allocation with the shapes that share each slice. Nothing runs on the GPU
except compilation, so it is cheap; the full reports go to --out-dir.

  python benchmarks/memory_report.py --configs paper-1.4B-n512,paper-30B-n1024 \
      --variants pallas,pallas:fused-x --out-dir /tmp/mem

Variants as ``kernel_profile.py``'s, a route path included (``pallas@two-step``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time

_DUMP_RE = "jit_memory_step"


def _top_rows(report: str, rows: int) -> list[str]:
  """The first (largest: the temporary allocation's) table of a memory-usage report."""
  lines = report.splitlines()
  out, in_table = [], False
  for ln in lines:
    if ln.strip().startswith("---"):
      in_table = True
      continue
    if in_table:
      if not ln.strip():
        break
      out.append(ln)
  return out[:rows]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="paper-1.4B-n512,paper-1.4B-n1024,paper-7B-n512")
  ap.add_argument("--variants", default="pallas,pallas:fused-x")
  ap.add_argument("--out-dir", default="memory_report_out")
  ap.add_argument("--rows", type=int, default=14)
  args = ap.parse_args(argv)
  dump = os.path.abspath(os.path.join(args.out_dir, "xla_dump"))
  os.makedirs(dump, exist_ok=True)
  # XLA reads its flags once, at backend start: set them before jax is imported.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_dump_to={dump} --xla_dump_hlo_module_re={_DUMP_RE}")
  import jax
  from sonic_jax.bench.configs import parse_configs
  from sonic_jax.bench.problems import make_problem
  from sonic_jax.bench.runner import fwdbwd_step
  from sonic_jax.bench.variants import layer_for

  summary = []
  for cfg in parse_configs(args.configs.split(",")):
    prob = make_problem(cfg, seed=0)
    for spec in args.variants.split(","):
      memory_step = fwdbwd_step(layer_for(spec, cfg.d, cfg.n, cfg.K))
      memory_step.__name__ = "memory_step"  # the XLA dump's module name (_DUMP_RE)

      before = set(glob.glob(os.path.join(dump, "*memory-usage-report.txt")))
      t0 = time.perf_counter()
      try:
        compiled = jax.jit(memory_step).lower(prob.x, prob.router_w, prob.w1, prob.w2,
                                              prob.dout).compile()
      except Exception as e:  # noqa: BLE001 - one bad variant must not hide the others
        print(f"== {cfg.name} [{spec}]: {type(e).__name__}: {str(e)[:300]}", flush=True)
        continue
      mem = compiled.memory_analysis()
      extra = mem.temp_size_in_bytes + mem.output_size_in_bytes
      new = sorted(set(glob.glob(os.path.join(dump, "*memory-usage-report.txt"))) - before)
      print(f"== {cfg.name} [{spec}]: {extra / 2**30:.3f} GiB above weights and inputs "
            f"(temp {mem.temp_size_in_bytes / 2**30:.3f}, out {mem.output_size_in_bytes / 2**30:.3f}"
            f"), compiled in {time.perf_counter() - t0:.1f} s", flush=True)
      summary.append((cfg.name, spec, extra / 2**30))
      if new:
        report = open(new[-1]).read()
        dest = os.path.join(args.out_dir, re.sub(r"[^\w.-]", "_", f"{cfg.name}-{spec}") + ".txt")
        with open(dest, "w") as f:
          f.write(report)
        for ln in _top_rows(report, args.rows):
          print("   " + ln)
  print("\nconfig | variant | GiB above weights and inputs")
  for name, spec, gib in summary:
    print(f"{name} | {spec} | {gib:.3f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
