"""Routing, routing-metadata and combine kernels in Triton (issue 9).

Two implementations of each kernel, selected with ``impl=``:

* ``"jax_triton"``: ``@triton.jit`` kernels (``_jt_kernels.py``) launched by jax-triton's
  ``triton_call``. Optional: needs the ``triton`` extra (``jax-triton`` 0.3.x, which targets
  triton 3.6; see docs/triton.md) and a CUDA GPU. Nothing here imports it until it is used.
* ``"pallas_triton"``: the same algorithms as ``pl.pallas_call`` kernels lowered by Pallas'
  Triton backend (``pallas_kernels.py``); no extra package; ``interpret=True`` runs them on a CPU.

Entry points: ``topk_softmax`` (fused softmax + top-K), ``routing_metadata`` /
``plan_from_assignments`` / ``route_logits`` (RoutingPlan without a full argsort),
``combine`` (per-token gather-and-sum) and ``dispatch`` (token rows to grouped rows). ``xla``
means the reference path in sonic_jax.routing and the xla backend.
"""

from __future__ import annotations

import functools

import jax

IMPLS = ("jax_triton", "pallas_triton")


@functools.cache
def jax_triton_unavailable_reason() -> str | None:
  """None when jax-triton kernels can run on the default device, else why not."""
  try:
    import triton  # noqa: F401
  except ImportError as e:
    return f"triton is not installed ({e}); pip install 'sonic-jax[triton]'"
  try:
    import jax_triton  # noqa: F401
  except ImportError as e:
    return f"jax_triton does not import ({e}); pip install 'sonic-jax[triton]'"
  return _gpu_reason()


def pallas_triton_unavailable_reason(interpret: bool = False) -> str | None:
  """None when Pallas-Triton kernels can run (always with ``interpret``), else why not."""
  return None if interpret else _gpu_reason()


def _gpu_reason() -> str | None:
  try:
    dev = jax.devices()[0]
  except RuntimeError as e:
    return str(e)
  if dev.platform != "gpu":
    return f"it needs a CUDA GPU and the default device is {dev.platform!r}"
  return None


def sequential(call):
  """``call`` (arrays -> arrays) with a batching rule that runs it once per batch element.

  jax-triton's primitive has no batching rule, and the Pallas-Triton kernels index their refs by
  hand (a widened grid would not be the same kernel), so every launch goes through this: the
  routing works under ``jax.vmap`` (as a loop) with either implementation.
  """
  return jax.custom_batching.sequential_vmap(call)


def jax_triton_call(*arrays, scalars: tuple = (), **kwargs):
  """``jax_triton.triton_call(*arrays, *scalars, **kwargs)`` through ``sequential``: the arrays
  are batched under vmap, the scalars (Python numbers) are closed over."""
  import jax_triton as jt
  return sequential(lambda *a: jt.triton_call(*a, *scalars, **kwargs))(*arrays)


def column_block(d: int, block_d: int | None, *, largest: int, arg: str, config_name: str,
                 kernel: str) -> int:
  """Columns per program of a row-moving kernel: ``block_d`` (it must divide d), or None: the
  largest power of two <= ``largest`` dividing d (d % 8 == 0: whole 16-byte bf16 vectors)."""
  if block_d is not None:
    if d % block_d:
      raise ValueError(f"{arg} (d = {d}) must be a multiple of {config_name}.block_d "
                       f"({block_d})")
    return block_d
  bd = largest
  while bd >= 8:
    if d % bd == 0:
      return bd
    bd //= 2
  raise ValueError(f"{arg} (d = {d}) must be a multiple of 8 for the Triton {kernel}")


def validate_impl(impl) -> None:
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def check_available(impl: str, interpret: bool) -> None:
  """Raises RuntimeError saying why ``impl`` cannot run here (after validate_impl)."""
  if impl == "jax_triton":
    if interpret:
      raise ValueError("interpret=True needs impl='pallas_triton' (jax-triton kernels have no "
                       "CPU interpreter)")
    reason = jax_triton_unavailable_reason()
  else:
    reason = pallas_triton_unavailable_reason(interpret)
  if reason:
    raise RuntimeError(f"impl={impl!r} is not available: {reason}")


ROUTE_IMPLS = ("xla", "auto") + IMPLS
# route_logits(impl="auto"): fastest first, by benchmarks/results/triton-h200-2026-12-02-s3.md
# (whole routing, current defaults: T = 24576, E = 128, K = 8: jax_triton 46.5 µs, pallas_triton
# 72.5 µs, xla 187 µs; T = 32768, E = 256, K = 16: 145 / 211 / 483 µs; jax_triton fastest at all
# five measured shapes).
AUTO_ROUTE_ORDER: tuple[str, ...] = ("jax_triton", "pallas_triton", "xla")


def validate_route_impl(impl, arg: str = "impl") -> None:
  """Raises ValueError naming ``arg`` unless ``impl`` is one of ROUTE_IMPLS."""
  if impl not in ROUTE_IMPLS:
    raise ValueError(f"{arg} must be one of {ROUTE_IMPLS}, got {impl!r}")


def resolve_route_impl(impl) -> str:
  """"auto" -> the first entry of AUTO_ROUTE_ORDER that runs on the default device."""
  validate_route_impl(impl)
  if impl != "auto":
    return impl
  for candidate in AUTO_ROUTE_ORDER:
    if candidate == "xla":
      return candidate
    reason = (jax_triton_unavailable_reason() if candidate == "jax_triton"
              else pallas_triton_unavailable_reason())
    if reason is None:
      return candidate
  return "xla"


from sonic_jax.triton.combine import CombineConfig, combine  # noqa: E402
from sonic_jax.triton.dispatch import DispatchConfig, dispatch  # noqa: E402
from sonic_jax.triton.metadata import (MetadataConfig, plan_from_assignments,  # noqa: E402
                                       route_logits, routing_metadata)
from sonic_jax.triton.select import SelectConfig, select_top_per_column  # noqa: E402
from sonic_jax.triton.topk import TopKConfig, topk_softmax  # noqa: E402

__all__ = ["IMPLS", "ROUTE_IMPLS", "sequential", "jax_triton_call", "AUTO_ROUTE_ORDER", "resolve_route_impl",
           "validate_route_impl", "TopKConfig",
           "MetadataConfig", "CombineConfig", "DispatchConfig", "topk_softmax", "routing_metadata",
           "plan_from_assignments", "route_logits", "combine", "dispatch",
           "jax_triton_unavailable_reason",
           "pallas_triton_unavailable_reason", "SelectConfig", "select_top_per_column"]
