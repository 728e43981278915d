"""Finds and loads libsonic_jax_cuda.so and registers its XLA FFI targets (once, lazily)."""

from __future__ import annotations

import ctypes
import functools
import os
import pathlib

LIBRARY_NAME = "libsonic_jax_cuda.so"
ENV_LIBRARY = "SONIC_JAX_FFI_LIBRARY"

# FFI target name -> exported handler symbol (csrc/ffi_handlers.cu).
TARGETS = {
    "sonic_jax_gather_rows": "SonicGatherRows",
    "sonic_jax_scatter_rows": "SonicScatterRows",
    "sonic_jax_grouped_gemm": "SonicGroupedGemm",
    "sonic_jax_gathered_grouped_gemm": "SonicGatheredGroupedGemm",
    "sonic_jax_gathered_varlen_k": "SonicGatheredVarlenK",
    "sonic_jax_up_proj_swiglu": "SonicUpProjSwiglu",
    "sonic_jax_dh_dswiglu": "SonicDhDSwiglu",
    "sonic_jax_swiglu_ha": "SonicSwigluHA",
    "sonic_jax_swiglu_a": "SonicSwigluA",
    "sonic_jax_swiglu_from_h": "SonicSwigluFromH",
    "sonic_jax_dswiglu": "SonicDSwiglu",
    "sonic_jax_combine_weighted": "SonicCombineWeighted",
    "sonic_jax_combine_unweighted": "SonicCombineUnweighted",
    "sonic_jax_combine_add": "SonicCombineAdd",
}
ABI_VERSION = 15  # 15: GemmConfig 18 and 19 (session 35)


def _search_dirs() -> list[pathlib.Path]:
  # An editable scikit-build install puts the library in site-packages while the .py files stay
  # in the source tree, so every entry of the package path is searched.
  import sonic_jax.ffi as pkg
  return [pathlib.Path(p) for p in pkg.__path__]


def find_library() -> pathlib.Path | None:
  """Path of the CUDA library ($SONIC_JAX_FFI_LIBRARY, else next to this package), or None."""
  env = os.environ.get(ENV_LIBRARY)
  if env:
    return pathlib.Path(env)
  for d in _search_dirs():
    if (d / LIBRARY_NAME).is_file():
      return d / LIBRARY_NAME
  return None


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
  path = find_library()
  if path is None:
    dirs = ", ".join(str(d) for d in _search_dirs())
    return None, (f"the CUDA library {LIBRARY_NAME} is not built (looked in {dirs}); build it "
                  f"with `python -m sonic_jax.ffi.build` on a machine with nvcc >= 12.3 and "
                  f"the nvidia-cutlass wheel (docs/ffi.md)")
  if not path.is_file():
    return None, f"{ENV_LIBRARY}={path} does not exist"
  try:
    lib = ctypes.CDLL(str(path))
  except OSError as e:
    return None, f"the CUDA library {path} failed to load: {e}"
  try:
    version = lib.sonic_jax_abi_version()
  except AttributeError:
    version = None
  if version != ABI_VERSION:
    return None, (f"the CUDA library {path} has ABI version {version}, this package needs "
                  f"{ABI_VERSION}; rebuild it with `python -m sonic_jax.ffi.build`")
  lib.sonic_jax_gemm_workspace_bytes.restype = ctypes.c_int64
  lib.sonic_jax_gemm_workspace_bytes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
  lib.sonic_jax_fused_tile_n.restype = ctypes.c_int
  lib.sonic_jax_fused_tile_n.argtypes = [ctypes.c_int, ctypes.c_int]
  lib.sonic_jax_check_layouts.restype = ctypes.c_int
  lib.sonic_jax_check_layouts.argtypes = []
  lib.sonic_jax_handler_calls.restype = ctypes.c_int64
  lib.sonic_jax_handler_calls.argtypes = [ctypes.c_int]
  return lib, None


def library_error() -> str | None:
  """Why the library cannot be loaded, or None."""
  return _load()[1]


@functools.cache
def library() -> ctypes.CDLL:
  """The loaded library with its FFI targets registered for the CUDA platform."""
  lib, err = _load()
  if err is not None:
    raise RuntimeError(err)
  import jax
  for name, symbol in TARGETS.items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="CUDA")
  return lib


@functools.cache
def gemm_workspace_bytes(kind: int, config: int, num_groups: int) -> int:
  """Workspace of one grouped GEMM; ValueError for a (kind, config) the library lacks."""
  n = library().sonic_jax_gemm_workspace_bytes(kind, config, num_groups)
  if n <= 0:
    raise ValueError(f"GEMM kind {kind} has no config {config} in {find_library()} "
                     f"(see csrc/sonic_ffi.h)")
  return int(n)


@functools.cache
def fused_tile_n(kind: int, config: int) -> int:
  """Output columns per tile of a fused-epilogue kind's config (dS_part is ceil(n / this)
  wide); ValueError for a pair the library lacks."""
  n = library().sonic_jax_fused_tile_n(kind, config)
  if n <= 0:
    raise ValueError(f"GEMM kind {kind} has no fused-epilogue config {config} in {find_library()}")
  return int(n)


def layouts_ok() -> bool:
  """Whether every gathered GEMM's layout assumptions hold (the fused epilogues' accumulator
  layout, the TMA boxes of B against the WGMMA stage layout). Host code only: no GPU needed."""
  lib, err = _load()
  if err is not None:
    raise RuntimeError(err)
  return bool(lib.sonic_jax_check_layouts())


def handler_calls() -> tuple[int, int]:
  """(all, during CUDA-graph stream capture) host invocations of the FFI handlers so far."""
  lib = library()
  return int(lib.sonic_jax_handler_calls(0)), int(lib.sonic_jax_handler_calls(1))
