"""The ``ffi`` backend: CUDA/CUTLASS kernels (csrc/) exposed through the XLA FFI.

The CUDA library ``libsonic_jax_cuda.so`` is optional. Build it where nvcc (>= 12.3) and the
``nvidia-cutlass`` wheel are installed with ``python -m sonic_jax.ffi.build`` (or
``SONIC_JAX_CUDA=ON pip install --no-build-isolation -e .``); see docs/ffi.md.
``unavailable_reason()`` says what is missing: the library, a GPU, or a Hopper (sm_90) GPU.
"""

from __future__ import annotations

from sonic_jax.ffi._lib import LIBRARY_NAME, find_library, library_error


def unavailable_reason() -> str | None:
  """None when the compiled library loads and a Hopper GPU is present, else everything missing."""
  reasons = []
  err = library_error()
  if err is not None:
    reasons.append(err)
  gpu = _gpu_reason()
  if gpu is not None:
    reasons.append(gpu)
  return "; ".join(reasons) if reasons else None


def is_available() -> bool:
  return unavailable_reason() is None


def _gpu_reason() -> str | None:
  import jax
  try:
    dev = jax.devices()[0]
  except RuntimeError as e:
    return f"no JAX device: {e}"
  if dev.platform != "gpu":
    return (f"no NVIDIA GPU: the kernels need a Hopper GPU (sm_90a) and the default JAX device "
            f"is {dev.platform!r}")
  cc = getattr(dev, "compute_capability", None)
  if cc != "9.0":
    return (f"the library is compiled for sm_90a (Hopper, compute capability 9.0) and the GPU "
            f"is {dev.device_kind} with compute capability {cc}")
  return None


__all__ = ["LIBRARY_NAME", "find_library", "is_available", "unavailable_reason"]
