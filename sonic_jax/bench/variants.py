"""Backend variants named on the command line of the diagnostic benchmarks.

``xla``, or ``pallas[:<backward_gathers>][:<option>...]`` with options ``dw1-early`` (dW1 where
XLA schedules it, ``PallasKernels(dw1_last=False)``) and ``dh-ring`` (dh on the warp-specialized
ring kernel fed by TMA, ``DhConfig(ring=True)``); e.g. ``pallas::dh-ring``, ``pallas:fused-x``.
"""

from __future__ import annotations

import dataclasses

OPTIONS = ("dw1-early", "dh-ring")


def kernels_for(spec: str, d: int | None = None, n: int | None = None):
  """The ExpertKernels (or backend name) that ``spec`` names for model width ``d`` and expert
  width ``n`` (needed by ``dh-ring``); SystemExit on a bad spec."""
  if spec == "xla":
    return "xla"
  name, *rest = spec.split(":")
  gathers, opts = (rest[0] if rest else "") or "auto", rest[1:]
  bad = [o for o in opts if o not in OPTIONS]
  if name != "pallas" or bad:
    raise SystemExit(f"unknown variant {spec!r}: xla or pallas[:<gathers>][:<option>...] with "
                     f"options {', '.join(OPTIONS)}")
  from sonic_jax.pallas import configs as cfg_lib
  from sonic_jax.pallas.backend import PallasKernels
  from sonic_jax.pallas.dh import dh_config_for
  config = None
  if "dh-ring" in opts:
    if d is None or n is None:
      raise SystemExit(f"variant {spec!r} needs the config's d and n")
    if gathers not in ("auto", "xla", "fused-x"):
      raise SystemExit(f"variant {spec!r}: dh-ring takes XLA's gathered dO (gathers auto, xla or "
                       "fused-x)")
    ring = dataclasses.replace(dh_config_for(d, n, gather="fused"), gather="xla", ring=True)
    config = cfg_lib.ForwardConfig(dh=ring)
  return PallasKernels(backward_gathers=gathers, dw1_last="dw1-early" not in opts, config=config)
