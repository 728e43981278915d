"""Times token rounding's per-expert selection: stable argsort, sonic_jax's bisection, and the
Triton radix-select kernels (sonic_jax.triton.select_top_per_column).

  python benchmarks/token_rounding_select.py [--shapes 32768x128,32768x256]
      [--configs default,2048:8:8,256:4:4] [--out benchmarks/results/NAME.md]

Every variant gives the same (T, E) keep mask (checked against the bisection before timing; a
variant with a different mask is not timed and fails the run); medians on the default device.
The radix kernels run where their implementation runs on the default device (a CUDA GPU; the
jax-triton one also needs the `triton` extra); elsewhere they are listed as skipped.
--configs: SelectConfig values as chunk:radix_bits:num_warps ("default": the implementation's).
--interpret: run the Pallas-Triton kernel in interpret mode where no GPU is (checks the masks on a
CPU; its times are the interpreter's, not a kernel's).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys

import jax
import jax.numpy as jnp

from sonic_jax import triton as tri
from sonic_jax.bench import timing
from sonic_jax.routing import select_top_per_column


def argsort_select(values, counts):
  """The former implementation: place of each row in a stable descending argsort per column."""
  t, e = values.shape
  order = jnp.argsort(-values, axis=0, stable=True)
  position = jnp.zeros_like(order).at[order, jnp.arange(e)[None, :]].set(
      jnp.arange(t, dtype=order.dtype)[:, None])
  return position < counts[None, :]


def parse_configs(text: str) -> list[tuple[str, tri.SelectConfig | None]]:
  out = []
  for item in text.split(","):
    if item == "default":
      out.append(("default", None))
      continue
    chunk, bits, warps = (int(x) for x in item.split(":"))
    out.append((item, tri.SelectConfig(chunk=chunk, radix_bits=bits, num_warps=warps)))
  return out


def variants(configs, interpret: bool = False):
  """[(name, fn or None, why not)] in table order."""
  out = [("argsort", argsort_select, None), ("bisection", select_top_per_column, None)]
  for impl in tri.IMPLS:
    interp = False
    if impl == "jax_triton":
      reason = tri.jax_triton_unavailable_reason()
    else:
      reason = tri.pallas_triton_unavailable_reason()
      interp = interpret and reason is not None
      reason = reason and tri.pallas_triton_unavailable_reason(interp)
    for label, cfg in configs:
      fn = None if reason else (
          lambda v, c, impl=impl, cfg=cfg, interp=interp: tri.select_top_per_column(
              v, c, impl=impl, config=cfg, interpret=interp))
      out.append((f"radix {impl} {label}{' (interpret)' if interp else ''}", fn, reason))
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--shapes", default="32768x128,32768x256", help="TxE list")
  ap.add_argument("--configs", default="default",
                  help="radix kernel configs: 'default' or chunk:radix_bits:num_warps, comma list")
  ap.add_argument("--iters", type=int, default=5)
  ap.add_argument("--interpret", action="store_true",
                  help="off a GPU, run the Pallas-Triton kernel in interpret mode (mask check)")
  ap.add_argument("--out", default=None, help="Markdown file to record the table in")
  args = ap.parse_args(argv)
  configs = parse_configs(args.configs)
  rows, ok = [], True
  for shape in args.shapes.split(","):
    t, e = (int(v) for v in shape.split("x"))
    v = jax.random.normal(jax.random.key(0), (t, e))
    c = jax.random.randint(jax.random.key(1), (e,), 0, min(t, 16 * t // e) + 1)
    ref = jax.jit(select_top_per_column)(v, c)
    base = None
    for name, fn, why_not in variants(configs, args.interpret):
      if fn is None:
        rows.append((t, e, name, None, None, f"skipped: {why_not}"))
        continue
      c_fn = timing.compile_fn(fn, (v, c))
      same = bool(jnp.all(c_fn.fn(v, c) == ref))
      if not same:
        ok = False
        rows.append((t, e, name, None, False, "not timed: different mask"))
        continue
      tm = timing.time_compiled(c_fn, (v, c), warmup=0, iters=args.iters, wall_too=False)
      if name == "bisection":
        base = tm.median_ms
      rows.append((t, e, name, tm.median_ms, True, tm.timer))
    rows[:] = [r if r[3] is None or base is None else r + (base / r[3],) for r in rows]
  dev = jax.devices()[0]
  lines = [f"# Token-rounding selection: argsort, bisection, radix-select kernels "
           f"({dev.device_kind})", "",
           f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
           f"jax {jax.__version__}; Python {platform.python_version()}; "
           f"platform {dev.platform}",
           f"- Command: `python {' '.join(sys.argv)}`",
           f"- Median of {args.iters} calls after one warm-up (sonic_jax.bench.timing: CUPTI "
           "kernel time on a GPU, wall clock elsewhere); random N(0,1) values, random "
           "per-expert counts; each mask checked equal to the bisection's before timing. The "
           "radix kernels' times include their XLA transposes.", "",
           "| T | E | variant | ms | speedup vs bisection | same mask | timer |",
           "| ---: | ---: | --- | ---: | ---: | :---: | --- |"]
  for r in rows:
    t, e, name, ms, same, timer = r[:6]
    speed = f"{r[6]:.2f}x" if len(r) > 6 else ""
    lines.append(f"| {t} | {e} | {name} | {'' if ms is None else f'{ms:.3f}'} | {speed} | "
                 f"{'' if same is None else ('yes' if same else 'NO')} | {timer} |")
  text = "\n".join(lines) + "\n"
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0 if ok else 1


if __name__ == "__main__":
  raise SystemExit(main())
