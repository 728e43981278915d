"""Times token rounding's per-expert selection: stable argsort vs sonic_jax's bisection.

  python benchmarks/token_rounding_select.py [--out benchmarks/results/NAME.md]

Both give the same (T, E) keep mask (checked here); medians on the default device.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys

import jax
import jax.numpy as jnp

from sonic_jax.bench import timing
from sonic_jax.routing import select_top_per_column


def argsort_select(values, counts):
  """The former implementation: place of each row in a stable descending argsort per column."""
  t, e = values.shape
  order = jnp.argsort(-values, axis=0, stable=True)
  position = jnp.zeros_like(order).at[order, jnp.arange(e)[None, :]].set(
      jnp.arange(t, dtype=order.dtype)[:, None])
  return position < counts[None, :]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--shapes", default="32768x128,32768x256", help="TxE list")
  ap.add_argument("--iters", type=int, default=5)
  ap.add_argument("--out", default=None, help="Markdown file to record the table in")
  args = ap.parse_args(argv)
  rows = []
  for shape in args.shapes.split(","):
    t, e = (int(v) for v in shape.split("x"))
    v = jax.random.normal(jax.random.key(0), (t, e))
    c = jax.random.randint(jax.random.key(1), (e,), 0, min(t, 16 * t // e) + 1)
    times, timers = {}, set()
    for name, fn in (("argsort", argsort_select), ("bisection", select_top_per_column)):
      c_fn = timing.compile_fn(fn, (v, c))
      jax.block_until_ready(c_fn.fn(v, c))
      tm = timing.time_compiled(c_fn, (v, c), warmup=0, iters=args.iters, wall_too=False)
      times[name] = tm.median_ms
      timers.add(tm.timer)
    same = bool(jnp.all(jax.jit(argsort_select)(v, c) == select_top_per_column(v, c)))
    rows.append((t, e, times["argsort"], times["bisection"], same, "/".join(sorted(timers))))
  dev = jax.devices()[0]
  lines = [f"# Token-rounding selection: argsort vs bisection ({dev.device_kind})", "",
           f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
           f"jax {jax.__version__}; Python {platform.python_version()}; "
           f"platform {dev.platform}",
           f"- Command: `python {' '.join(sys.argv)}`",
           f"- Median of {args.iters} calls after one warm-up (sonic_jax.bench.timing: CUPTI "
           "kernel time on a GPU, wall clock elsewhere); random N(0,1) values, random "
           "per-expert counts.", "",
           "| T | E | argsort ms | bisection ms | speedup | same mask | timer |",
           "| ---: | ---: | ---: | ---: | ---: | :---: | --- |"]
  lines += [f"| {t} | {e} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {'yes' if s else 'NO'} | {tm} |"
            for t, e, a, b, s, tm in rows]
  text = "\n".join(lines) + "\n"
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
  raise SystemExit(main())
