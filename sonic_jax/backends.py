"""Backend registry: ``xla`` everywhere, ``pallas`` (Mosaic GPU, Hopper) and ``ffi`` (CUTLASS).

``backend="auto"`` runs each call on the first backend of ``auto_order(d, n)`` that is available
on the default device and accepts the call's shapes and dtypes (its ``validate``), else on
``xla``: ``select_backend`` makes that choice, ``resolve_backend("auto", d=..., n=...).name``
says which backend a (d, n) layer gets when its dtypes and sizes suit it.

Besides the three backends, ``COMBINED`` names combinations of two, each a ``MixedKernels``:
``"pallas+ffi"``, the ``pallas`` forward (up_proj, down_proj, combine) with the ``ffi`` backward
GEMMs (dh, dw2, dx_pairs, dw1), which ``auto`` puts first where n <= PALLAS_FFI_MAX_N; and
``"pallas+ffi-wgrad"``, ``pallas``' forward and dh with ``ffi``'s dx_pairs and weight gradients,
dW1 / dW2 reading x / dO through the gather index (opt-in: not yet timed as one step). Both can be
named like the three backends.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import jax

from sonic_jax.kernels import ExpertKernels

BACKENDS = ("xla", "pallas", "ffi")
# Fastest first where the shape is not known (``resolve_backend("auto")``).
AUTO_ORDER = ("pallas", "ffi", "xla")
# Where the shape is known, ffi goes first at n >= FFI_FIRST_MIN_N, pallas below. Whole-layer
# forward+backward on the H200, ms ffi / pallas, both backends in the same device calls (session 35,
# benchmarks/results/bench-h200-2026-12-07-merged.md):
# - ffi faster: 7B-n512 3.103 / 3.193, 7B-n1024 2.843 / 2.913, 30B-n512 19.218 / 20.166,
#   120B-n1024 35.082 / 37.037, 120B-n2048 33.134 / 36.113, OLMoE-1B-7B 8.808 / 9.012,
#   Qwen3-30B-A3B 7.268 / 7.517, DeepSeek-V3-like 68.077 / 73.838, Mixtral-8x7B 55.243 / 59.043.
# - pallas faster: 1.4B-n256 3.312 / 3.235, 30B-n256 23.371 / 22.395.
# - Within the 2-5 % spread between device calls: 7B-n256 3.584 / 3.596; 30B-n1024 17.663 / 17.698
#   (18.223 / 17.666 in the other call) and 120B-n512 40.142 / 39.812 (39.642 / 40.639); at d = 768
#   1.4B-n512 2.861 / 2.922 and 1.4B-n1024 2.702 / 2.676. Until session 35 the rule also asked
#   for d >= 1536, from sessions 14-22's rows where pallas led at the 1.4B configs by up to 2 %.
# ffi's step takes more memory where n > 256 (e.g. 8.00 against 6.50 GiB at 120B-n1024, 7.75
# against 4.88 at Mixtral-8x7B): pass backend="pallas" to keep the smaller one.
FFI_FIRST_MIN_N = 512

# Named combinations of two backends: name -> (base backend, {entry point: backend}), a backend
# being a name, or (name, options) for that backend's kernels class (PallasKernels / FfiKernels).
_Part = str | tuple[str, tuple[tuple[str, object], ...]]
PALLAS_FFI = "pallas+ffi"
# ffi's wgrad_gather="auto" reads x / dO through the index only where ffi's own forward and dh
# make no copy of them; behind pallas' forward and dh no copy exists at any n.
_FFI_GATHERED_WGRAD: _Part = ("ffi", (("wgrad_gather", "both"),))
PALLAS_FFI_WGRAD = "pallas+ffi-wgrad"
COMBINED: dict[str, tuple[str, dict[str, _Part]]] = {
    PALLAS_FFI: ("pallas", {"dh": "ffi", "dw2": "ffi", "dx_pairs": "ffi", "dw1": "ffi"}),
    # Each entry point on the backend that ran it faster in session 37's H100 profiles of
    # 120B-n512 (docs/ffi.md, "Where 120B-n512's step goes", lever 5): pallas' up_proj with the
    # gather and SwiGLU in the kernel, its down_proj, and its dh with the dO gather and
    # dSwiGLU / dS / A' in one kernel; ffi's dx_pairs and weight gradients. By those profiles
    # about 8 % under ffi's step there; scripts/device_s38.sh times it.
    PALLAS_FFI_WGRAD: ("pallas", {"dx_pairs": _FFI_GATHERED_WGRAD, "dw1": _FFI_GATHERED_WGRAD,
                                  "dw2": _FFI_GATHERED_WGRAD}),
}
# Where the shape is known and n <= PALLAS_FFI_MAX_N, auto tries "pallas+ffi" first: each
# backend's half is the faster one there. Layer step (forward+backward), kernel ms, pallas / ffi /
# pallas+ffi, interleaved in one process (session 37, benchmarks/results/s37-2026-12-07.md):
# - H200: 1.4B-n256 3.202 / 3.242 / 3.092, 7B-n256 3.571 / 3.447 / 3.336, 30B-n256 21.948 /
#   21.778 / 21.815 (power-capped clocks, within the spread).
# - H100: 7B-n256 3.947 / 3.787 / 3.702, 1.4B-n256 3.556 / 3.639 / 3.485; the layer benchmark
#   (f+b ms) 1.4B-n256 3.578 / 3.673 / 3.521, 7B-n256 3.975 / 3.824 / 3.738, 30B-n256 23.309 /
#   23.501 / 22.984.
# At n = 512 it won no config by more than the spread (H200 1.4B-n512 2.887 / 2.798 / 2.775,
# 7B-n512 3.153 / 3.029 / 3.058; 30B-n512 and H100 120B-n512 under power capping), so ffi
# stays first there.
PALLAS_FFI_MAX_N = 256
# Every name ``backend=`` takes besides "auto".
NAMES = BACKENDS + tuple(COMBINED)


def auto_order(d: int | None = None, n: int | None = None) -> tuple[str, ...]:
  """The backends ``backend="auto"`` tries, fastest first, for model width d and expert width n
  (``AUTO_ORDER`` where either is unknown; the rule itself reads n only). Names come from
  BACKENDS and COMBINED."""
  if d is None or n is None:
    return AUTO_ORDER
  if n >= FFI_FIRST_MIN_N:
    return ("ffi", "pallas", "xla")
  if n <= PALLAS_FFI_MAX_N:
    return (PALLAS_FFI, "pallas", "ffi", "xla")
  return AUTO_ORDER


class BackendUnavailableError(RuntimeError):
  """The requested backend cannot run here; the message says why and how to get it."""


def _load_xla() -> ExpertKernels:
  from sonic_jax.xla_backend import XlaKernels
  return XlaKernels()


def _load_pallas(**options) -> ExpertKernels:
  from sonic_jax.pallas import backend as pallas_backend
  reason = pallas_backend.unavailable_reason()
  if reason:
    raise BackendUnavailableError(f"backend='pallas' is not available: {reason}")
  return pallas_backend.PallasKernels(**options)


def _load_ffi(**options) -> ExpertKernels:
  from sonic_jax import ffi
  reason = ffi.unavailable_reason()
  if reason:
    raise BackendUnavailableError(f"backend='ffi' is not available: {reason}")
  from sonic_jax.ffi.backend import FfiKernels
  return FfiKernels(**options)


def _load_combined(name: str) -> ExpertKernels:
  """COMBINED[name] as a MixedKernels named ``name``; BackendUnavailableError (saying which part
  is missing) where either backend is."""
  from sonic_jax.mixed import MixedKernels
  base, entries = COMBINED[name]
  try:
    return MixedKernels(_resolve_part(base), name=name,
                        **{entry: _resolve_part(b) for entry, b in entries.items()})
  except BackendUnavailableError as e:
    raise BackendUnavailableError(f"backend={name!r} is not available: {e}") from None


def _resolve_part(backend: _Part) -> ExpertKernels:
  """A COMBINED part: a backend name, or (name, options); one instance per distinct part."""
  return _resolve_name(backend) if isinstance(backend, str) else _resolve_name(*backend)


_LOADERS: dict[str, Callable[..., ExpertKernels]] = {
    "xla": _load_xla, "pallas": _load_pallas, "ffi": _load_ffi,
    **{name: functools.partial(_load_combined, name) for name in COMBINED}}


def validate_backend_name(backend) -> None:
  if isinstance(backend, ExpertKernels):
    return
  if backend != "auto" and backend not in NAMES:
    raise ValueError(
        f"backend must be 'auto', one of {NAMES} or an ExpertKernels instance, got "
        f"{backend!r}")


@functools.cache
def _resolve_name(name: str, options: tuple[tuple[str, object], ...] = ()) -> ExpertKernels:
  """The kernels of backend ``name`` (with ``options`` for its kernels class), loaded once."""
  return _LOADERS[name](**dict(options))


def _available(name: str) -> ExpertKernels | None:
  try:
    return _resolve_name(name)
  except (BackendUnavailableError, ImportError):
    return None


def resolve_backend(backend: str | ExpertKernels = "auto", *, d: int | None = None,
                    n: int | None = None) -> ExpertKernels:
  """Returns the kernels for ``backend`` or raises ``BackendUnavailableError`` saying why.

  For "auto": the first available backend of ``auto_order(d, n)`` (model width d, expert width
  n; without them, of ``AUTO_ORDER``). A call may still run elsewhere where that backend rejects
  its dtypes or sizes: ``select_backend`` decides per call.
  """
  validate_backend_name(backend)
  if isinstance(backend, ExpertKernels):
    return backend
  if backend != "auto":
    return _resolve_name(backend)
  for name in auto_order(d, n):
    kernels = _available(name)
    if kernels is not None:
      return kernels
  return _load_xla()


def select_backend(backend: str | ExpertKernels, x: jax.Array, plan, w1: jax.Array,
                   w2: jax.Array) -> ExpertKernels:
  """The kernels that run one expert-block call, validated for its operands (before any kernel).

  Args:
    backend: a name or an ExpertKernels instance. A named backend must accept the call (its
      ``validate`` raises ValueError naming the argument and the rule otherwise). "auto" takes
      the first of ``auto_order(d, n)`` that is available and accepts it, and warns when a GPU
      backend that is available is passed over (e.g. float32 operands), since the next one may
      be much slower.
    x: (T, d); plan: RoutingPlan; w1: (E, d, 2n); w2: (E, n, d).
  """
  if isinstance(backend, ExpertKernels) or backend != "auto":
    kernels = resolve_backend(backend)
    kernels.validate(x, plan, w1, w2)
    return kernels
  d, n = x.shape[1], w2.shape[1]
  rejected = []
  for name in auto_order(d, n):
    kernels = _available(name)
    if kernels is None:
      continue
    try:
      kernels.validate(x, plan, w1, w2)
    except ValueError as e:
      rejected.append(f"{name}: {e}")
      continue
    if rejected:
      warnings.warn(f"backend='auto' runs this call (d = {d}, n = {n}, dtype {x.dtype}) on "
                    f"{kernels.name}: " + "; ".join(rejected), stacklevel=3)
    return kernels
  raise ValueError("backend='auto' found no backend for this call: " + "; ".join(rejected))


def available_backends() -> list[str]:
  """Names of the backends that can run on the default device."""
  return [name for name in BACKENDS if _available(name) is not None]


__all__ = ["BACKENDS", "AUTO_ORDER", "COMBINED", "FFI_FIRST_MIN_N", "NAMES", "PALLAS_FFI",
           "PALLAS_FFI_MAX_N", "PALLAS_FFI_WGRAD", "BackendUnavailableError", "auto_order",
           "available_backends", "resolve_backend", "select_backend"]
