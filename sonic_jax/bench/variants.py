"""Backend variants named on the command line of the diagnostic benchmarks.

``xla``, or ``pallas[:<backward_gathers>][:<option>...]``. Options: ``dw1-early`` (dW1 where XLA
schedules it, ``PallasKernels(dw1_last=False)``), ``dh-ring`` (dh on the warp-specialized ring
kernel fed by TMA, ``DhConfig(ring=True)``) and ``dh.<field>=<int>`` (one field of the default
``DhConfig`` replaced, e.g. ``dh.block_n=64``, ``dh.num_sms=264``). Examples: ``pallas:fused-x``,
``pallas::dh-ring``, ``pallas::dh.block_n=64:dh.num_sms=264``.
"""

from __future__ import annotations

import dataclasses

OPTIONS = ("dw1-early", "dh-ring", "dh.<field>=<int>")


def _dh_field(opt: str) -> tuple[str, int] | None:
  if not opt.startswith("dh.") or "=" not in opt:
    return None
  field, value = opt[3:].split("=", 1)
  from sonic_jax.pallas.dh import DhConfig
  if field not in {f.name for f in dataclasses.fields(DhConfig)} or not value.isdigit():
    return None
  return field, int(value)


def kernels_for(spec: str, d: int | None = None, n: int | None = None):
  """The ExpertKernels (or backend name) that ``spec`` names for model width ``d`` and expert
  width ``n`` (needed by the dh options); SystemExit on a bad spec."""
  if spec == "xla":
    return "xla"
  name, *rest = spec.split(":")
  gathers, opts = (rest[0] if rest else "") or "auto", rest[1:]
  bad = [o for o in opts if o not in OPTIONS[:2] and _dh_field(o) is None]
  if name != "pallas" or bad:
    raise SystemExit(f"unknown variant {spec!r}: xla or pallas[:<gathers>][:<option>...] with "
                     f"options {', '.join(OPTIONS)}")
  from sonic_jax.pallas import configs as cfg_lib
  from sonic_jax.pallas.backend import PallasKernels
  kern = PallasKernels(backward_gathers=gathers, dw1_last="dw1-early" not in opts)
  dh_opts = [o for o in opts if o.startswith("dh")]
  if dh_opts:
    if d is None or n is None:
      raise SystemExit(f"variant {spec!r} needs the config's d and n")
    dh = kern._dh_config(d, n)
    if "dh-ring" in dh_opts:
      if dh.gather != "xla":
        raise SystemExit(f"variant {spec!r}: dh-ring takes XLA's gathered dO, but dh gathers "
                         f"with {dh.gather!r} at d={d}, n={n}")
      dh = dataclasses.replace(dh, ring=True, max_concurrent_steps=3)
    dh = dataclasses.replace(dh, **dict(f for f in map(_dh_field, dh_opts) if f))
    kern = PallasKernels(backward_gathers=gathers, dw1_last=kern.dw1_last,
                         config=cfg_lib.ForwardConfig(dh=dh))
  return kern
