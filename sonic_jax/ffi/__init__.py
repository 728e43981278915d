"""The ``ffi`` backend: CUDA/CUTLASS kernels (csrc/) exposed through the XLA FFI."""

from __future__ import annotations


def unavailable_reason() -> str | None:
  """None when the compiled library loads and a Hopper GPU is present, else why not."""
  return ("the CUDA library is not built; build csrc/ with nvcc (see README, 'FFI backend')")


def is_available() -> bool:
  return unavailable_reason() is None
