"""Size of the persistent grid every Pallas kernel of this package launches (one CTA per SM)."""

from __future__ import annotations

import jax

# Off a GPU (lowering for CUDA on a CPU host) the kernels assume an H100 / H200 SXM.
DEFAULT_SMS = 132


def persistent_ctas(num_sms: int | None, interpret) -> int:
  """CTAs of a persistent kernel: ``num_sms`` when a config sets it; 2 in the interpreter (it
  runs the grid sequentially, and a few "SMs" exercise the striding); else the device's SM
  count (``DEFAULT_SMS`` where the default device has none, e.g. a CPU host)."""
  if num_sms is not None:
    return num_sms
  if interpret:
    return 2
  return getattr(jax.devices()[0], "core_count", None) or DEFAULT_SMS
