"""Where the layer step's x gradient is summed, and what the separate add costs.

  python benchmarks/dx_add.py [--config paper-7B-n256] [--backends pallas,ffi] [--iters 10]
                              [--hlo-dir DIR]

x has two uses in a layer (the router and the expert block), so autodiff adds their
cotangents: the router's dx GEMM (dl · router_wᵀ) and the expert block's dx combine. On the
H200 that add is its own kernel at the end of the step (47-57 µs at the n = 256 paper configs,
about 1.5 % of the pallas step; 0.19 ms at 120B-n1024 on ffi). XLA's cuBLAS GEMM can take an
add as its addend (beta = 1). Per backend this prints the optimized HLO's producer of the x
gradient (a cuBLAS GEMM with the add folded in, or a separate add fusion), the number of
standalone adds of x's shape and the step time (CUPTI median on a GPU); run it again with
XLA_FLAGS=--xla_gpu_enable_cublaslt=true for cuBLASLt. Session 25 (H100, 7B-n256 and
1.4B-n512, both backends, with and without cuBLASLt, and with dx taken from the dw1_last
ordering barrier so that each value has one user): always a separate ``wrapped_add`` loop
fusion, so XLA does not fold it here; removing it takes the router's dx GEMM inside the
expert block's backward (benchmarks/results/s25-h100-2026-12-06.md). Since session 26
``sonic_jax.moe`` does that (``experts.moe_top_k``: the router's dx is the addend of the dx
combine), so the producer should now be the combine (an XLA reduce fusion for pallas, the
``sonic_jax_combine_add`` custom call for ffi) with no standalone add.
"""

from __future__ import annotations

import argparse
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.bench import configs, timing
from sonic_jax.bench.problems import RoutingSpec, make_problem, sonic_layer
from sonic_jax.bench.runner import fwdbwd_step

_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")


def _entry(hlo: str) -> dict[str, tuple[str, str, str]]:
  """name -> (result type, opcode, rest of line) of the ENTRY computation, plus "ROOT"."""
  out, inside = {}, False
  for line in hlo.splitlines():
    if line.startswith("ENTRY"):
      inside = True
      continue
    if inside and line.startswith("}"):
      break
    m = _INSTR.match(line) if inside else None
    if m:
      out[m.group(2)] = (m.group(3), m.group(4), m.group(5))
      if m.group(1):
        out["ROOT"] = out[m.group(2)]
  return out


def _operands(rest: str) -> list[str]:
  return re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])


def x_grad_producer(hlo: str, index: int = 1) -> str:
  """The instruction that produces output ``index`` of the ENTRY's root tuple (the step
  returns (out, dx, drouter, dw1, dw2) flattened), following get-tuple-element, bitcast and
  copy to the real producer: its opcode, custom-call target and fusion kind / name."""
  instrs = _entry(hlo)
  root = instrs.get("ROOT")
  if root is None or root[1] != "tuple":
    return "unknown (no root tuple)"
  name = _operands(root[2])[index]
  seen = []
  while name in instrs:
    typ, op, rest = instrs[name]
    seen.append(f"{name}={op}")
    if op in ("get-tuple-element", "bitcast", "copy"):
      name = _operands(rest)[0]
      continue
    target = re.search(r'custom_call_target="([^"]+)"', rest)
    beta = re.search(r'"beta":\s*([\d.]+)', rest)
    kind = re.search(r"kind=(\w+)", rest)
    desc = f"{op} {name}"
    if target:
      desc += f" target={target.group(1)}"
    if beta:
      desc += f" beta={beta.group(1)}"
    if kind:
      desc += f" {kind.group(1)}"
    return desc + (f"  (via {' <- '.join(seen[:-1])})" if len(seen) > 1 else "")
  return f"unknown ({name} not in ENTRY)"


def standalone_adds(hlo: str, shape: str) -> int:
  """Fusions in ENTRY named like XLA's single-add wrappers, or adds, whose result is ``shape``
  (e.g. 'bf16[24576,1536]')."""
  n = 0
  for name, (typ, op, rest) in _entry(hlo).items():
    if name == "ROOT" or not typ.startswith(shape):
      continue
    if op == "add" or (op == "fusion" and "add" in name and "reduce" not in name):
      n += 1
  return n


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="paper-7B-n256", help="a config name or T,d,n,E,K")
  ap.add_argument("--backends", default="pallas,ffi")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--hlo-dir", default=None, help="write each backend's optimized HLO here")
  args = ap.parse_args(argv)
  cfg = configs.parse_configs(args.config)[0]
  dtype = jnp.bfloat16
  problem = make_problem(cfg, dtype=dtype)
  step_args = (*problem.args, problem.dout)
  shape = f"bf16[{cfg.T},{cfg.d}]"
  flags = os.environ.get("XLA_FLAGS", "")
  print(f"{cfg.name} {cfg.shape} on {jax.devices()[0].device_kind}; XLA_FLAGS={flags!r}")
  rows = []
  for backend in [b for b in args.backends.split(",") if b]:
    try:
      step = fwdbwd_step(sonic_layer(backend, cfg, RoutingSpec()))
      c = timing.compile_fn(step, step_args)
    except Exception as e:  # noqa: BLE001 - report and go on with the next one
      rows.append((backend, f"failed: {type(e).__name__}: {str(e)[:120]}", "", ""))
      continue
    hlo = c.fn.as_text()
    if args.hlo_dir:
      os.makedirs(args.hlo_dir, exist_ok=True)
      with open(os.path.join(args.hlo_dir, f"{cfg.name}-{backend}.hlo.txt"), "w") as f:
        f.write(hlo)
    dx = jax.block_until_ready(c.fn(*step_args))[1][0]
    if not np.isfinite(np.asarray(dx, np.float32)).all():
      raise SystemExit(f"{backend}: the x gradient is not finite")
    t = timing.time_compiled(c, step_args, warmup=args.warmup, iters=args.iters, wall_too=False)
    rows.append((backend, f"{t.median_ms:.3f} ({t.timer})", str(standalone_adds(hlo, shape)),
                 x_grad_producer(hlo)))
    del dx
  print(f"{'backend':8s} {'step ms':16s} {'adds':4s} x-gradient producer")
  for r in rows:
    print(f"{r[0]:8s} {r[1]:16s} {r[2]:4s} {r[3]}")


if __name__ == "__main__":
  main()
