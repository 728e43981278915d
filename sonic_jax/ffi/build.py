"""Builds libsonic_jax_cuda.so from csrc/ with CMake and puts it next to this package.

  python -m sonic_jax.ffi.build [--cutlass-include DIR] [--build-dir DIR] [--jobs N] [--check]

Needs nvcc >= 12.3 (sm_90a), CMake >= 3.24, jax (for the XLA FFI headers) and the CUTLASS 4.2
headers: the ``nvidia-cutlass==4.2.0.0`` wheel (``pip install --no-deps nvidia-cutlass==4.2.0.0``)
or --cutlass-include / $CUTLASS_INCLUDE_DIR pointing at its ``cutlass_library/source/include``.
``--check`` compiles and links only (CI compile check), without copying the library. Either way
the built library's host-side layout checks run (no GPU needed) and a failure fails the build.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import shutil
import subprocess
import sys

from sonic_jax.ffi._lib import LIBRARY_NAME

_PKG_DIR = pathlib.Path(__file__).resolve().parent
_REPO = _PKG_DIR.parent.parent


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m sonic_jax.ffi.build", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--source-dir", default=str(_REPO / "csrc"))
  ap.add_argument("--build-dir", default=str(_REPO / "build" / "ffi"))
  ap.add_argument("--cutlass-include", default=os.environ.get("CUTLASS_INCLUDE_DIR", ""))
  ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
  ap.add_argument("--check", action="store_true", help="compile and link only")
  args = ap.parse_args(argv)

  src = pathlib.Path(args.source_dir)
  if not (src / "CMakeLists.txt").is_file():
    print(f"error: no CMakeLists.txt in {src} (the build needs the source checkout)",
          file=sys.stderr)
    return 2
  if shutil.which("cmake") is None:
    print("error: cmake not found", file=sys.stderr)
    return 2
  configure = ["cmake", "-S", str(src), "-B", args.build_dir, "-DSONIC_JAX_CUDA=ON",
               "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}"]
  if shutil.which("ninja"):
    configure += ["-G", "Ninja"]
  if args.cutlass_include:
    configure.append(f"-DCUTLASS_INCLUDE_DIR={args.cutlass_include}")
  for cmd in (configure, ["cmake", "--build", args.build_dir, "-j", str(args.jobs)]):
    print("+", " ".join(cmd), flush=True)
    if subprocess.call(cmd) != 0:
      return 1
  built = pathlib.Path(args.build_dir) / LIBRARY_NAME
  if not built.is_file():
    print(f"error: {built} was not produced", file=sys.stderr)
    return 1
  # Host code only (no GPU): every gathered GEMM's layout assumptions (the fused epilogues'
  # accumulator layout, the TMA boxes of the weights against the WGMMA stage layout).
  if not ctypes.CDLL(str(built)).sonic_jax_check_layouts():
    print(f"error: {built}: a gathered GEMM's layout check failed (csrc/gather_gemm.cuh)",
          file=sys.stderr)
    return 1
  print("layout checks passed")
  if not args.check:
    shutil.copy2(built, _PKG_DIR / LIBRARY_NAME)
    print(f"installed {_PKG_DIR / LIBRARY_NAME}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
