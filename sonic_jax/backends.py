"""Backend registry: ``xla`` everywhere, ``pallas`` (Mosaic GPU, Hopper) and ``ffi`` (CUTLASS).

``backend="auto"`` picks the first available entry of ``AUTO_ORDER`` on the default device;
``resolve_backend("auto").name`` says which one it picked.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax

from sonic_jax.kernels import ExpertKernels

BACKENDS = ("xla", "pallas", "ffi")
# Fastest first, by the measured results in benchmarks/results/.
AUTO_ORDER = ("pallas", "ffi", "xla")


class BackendUnavailableError(RuntimeError):
  """The requested backend cannot run here; the message says why and how to get it."""


def _load_xla() -> ExpertKernels:
  from sonic_jax.xla_backend import XlaKernels
  return XlaKernels()


def _load_pallas() -> ExpertKernels:
  from sonic_jax.pallas import backend as pallas_backend
  reason = pallas_backend.unavailable_reason()
  if reason:
    raise BackendUnavailableError(f"backend='pallas' is not available: {reason}")
  return pallas_backend.PallasKernels()


def _load_ffi() -> ExpertKernels:
  from sonic_jax import ffi
  reason = ffi.unavailable_reason()
  if reason:
    raise BackendUnavailableError(f"backend='ffi' is not available: {reason}")
  from sonic_jax.ffi.backend import FfiKernels
  return FfiKernels()


_LOADERS: dict[str, Callable[[], ExpertKernels]] = {
    "xla": _load_xla, "pallas": _load_pallas, "ffi": _load_ffi}


def validate_backend_name(backend) -> None:
  if isinstance(backend, ExpertKernels):
    return
  if backend != "auto" and backend not in BACKENDS:
    raise ValueError(
        f"backend must be 'auto', one of {BACKENDS} or an ExpertKernels instance, got "
        f"{backend!r}")


@functools.cache
def _resolve_name(name: str) -> ExpertKernels:
  if name != "auto":
    return _LOADERS[name]()
  for candidate in AUTO_ORDER:
    try:
      return _LOADERS[candidate]()
    except (BackendUnavailableError, ImportError):
      continue
  return _load_xla()


def resolve_backend(backend: str | ExpertKernels = "auto") -> ExpertKernels:
  """Returns the kernels for ``backend`` or raises ``BackendUnavailableError`` saying why."""
  validate_backend_name(backend)
  if isinstance(backend, ExpertKernels):
    return backend
  return _resolve_name(backend)


def available_backends() -> list[str]:
  """Names of the backends that can run on the default device."""
  out = []
  for name in BACKENDS:
    try:
      _resolve_name(name)
      out.append(name)
    except (BackendUnavailableError, ImportError):
      pass
  return out


__all__ = ["BACKENDS", "AUTO_ORDER", "BackendUnavailableError", "resolve_backend",
           "available_backends"]
