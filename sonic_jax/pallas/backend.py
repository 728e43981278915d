"""The ``pallas`` backend: Mosaic GPU kernels behind the kernel contract."""

from __future__ import annotations

import jax

from sonic_jax.kernels import ExpertKernels


def unavailable_reason(interpret: bool = False) -> str | None:
  """None when the Pallas kernels can run on the default device, else why not."""
  if interpret:
    return None
  try:
    dev = jax.devices()[0]
  except RuntimeError as e:  # no backend at all
    return str(e)
  if dev.platform != "gpu":
    return (f"it needs an NVIDIA Hopper GPU (sm_90a) and the default device is "
            f"{dev.platform!r}; on a CPU use sonic_jax.pallas.backend.PallasKernels("
            f"interpret=True) to run the kernels in the Mosaic GPU interpreter")
  cc = getattr(dev, "compute_capability", None)
  if cc != "9.0":
    return f"it needs compute capability 9.0 (Hopper), found {cc} on {dev.device_kind}"
  return None


class PallasKernels(ExpertKernels):
  """Mosaic GPU grouped GEMMs; ``interpret=True`` runs them in the GPU interpreter on a CPU."""

  name = "pallas"

  def __init__(self, interpret: bool = False):
    self.interpret = interpret

  def __hash__(self):
    return hash((type(self), self.interpret))

  def __eq__(self, other):
    return type(other) is type(self) and other.interpret == self.interpret
