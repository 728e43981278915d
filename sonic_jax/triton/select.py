"""Per-column top-``counts[e]`` selection (token rounding's kernel 3) by radix select.

``select_top_per_column(values, counts)`` returns the same (T, E) mask as
``sonic_jax.routing.select_top_per_column``: per column e, the ``counts[e]`` largest values, ties
broken by row order (earlier rows first). Algorithm:

1. XLA: keys = ``routing._ordered_key(values)`` (the reference's own order-preserving int32 key,
   -0.0 folded into +0.0) transposed to (E, T), so each column is contiguous; the elementwise key
   fuses into the transpose.
2. Kernel, one program per column, r = clip(counts[e], 0, T): a most-significant-digit-first radix
   select finds the r-th largest key ``thr`` in 32 / radix_bits passes over the column. Pass p
   histograms digit p (radix_bits bits) of the keys that share the digits found so far (the top
   digit with its sign bit flipped, so unsigned digit order is signed key order); the chosen digit
   b is the largest with #{candidates with digit >= b} >= rem, and rem drops by the candidates
   with a larger digit. After the last pass thr is fixed and rem (>= 1 when r >= 1) is how many
   rows equal to thr are kept.
3. A last pass writes keep = key > thr, or key == thr and the row is among the first rem such
   rows (a running count across the program's chunks, which run in row order, plus an in-chunk
   prefix sum). r = 0 keeps nothing.
4. XLA: transpose the int8 (E, T) mask back to (T, E) bool.

The threshold is exactly the reference's (its bisection finds the largest t with
#{key >= t} >= r, i.e. the r-th largest key) and so are the ties kept, so the masks agree bit for
bit for any input, NaNs included (both order their int32 key bits). Counts outside [0, T] behave
as the reference does with them (as 0 / T). Cost: (32 / radix_bits + 1) reads of the column
(E * T * 4 bytes each, L2-resident at the token-rounding sizes) instead of XLA's 32 reductions
over (T, E). The jax-triton kernel bins with ``tl.histogram``; the Pallas-Triton one has no
histogram and sums a (chunk, 2**radix_bits) comparison, hence its smaller default digit.

Opt-in: not used by the routing; untimed on a GPU so far.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax import triton as tri
from sonic_jax.routing import _ordered_key

_I32 = jnp.int32
_RADIX_BITS = (2, 4, 8)
# Per-implementation defaults (chunk, radix_bits, num_warps), chosen without GPU timings (to be
# swept on the H200 with benchmarks/token_rounding_select.py --configs). A program per column
# leaves each SM one or two programs whose chunk loop is load-latency bound, so chunks are large;
# jax-triton's tl.histogram makes 8-bit digits (4 passes) cheap; Pallas-Triton's one-hot count
# costs chunk * 2**radix_bits compares per chunk, so it takes 4-bit digits (8 passes). Neither
# spills registers (ptxas, sm_90a: ~100 and ~50 per thread, so two 8-warp programs fit an SM and
# E = 256 columns one wave; jax-triton at 4096 rows needs 160, one program per SM).
_DEFAULTS = {"jax_triton": (2048, 8, 8), "pallas_triton": (1024, 4, 8)}


@dataclasses.dataclass(frozen=True)
class SelectConfig:
  """chunk: rows a program handles at a time (a power of two, 16..4096); radix_bits: bits per
  radix digit (2, 4 or 8; 32 / radix_bits histogram passes); num_warps per program. None: the
  implementation's default (jax_triton: 2048 rows, 8 bits, 8 warps; pallas_triton: 1024 rows,
  4 bits, 8 warps)."""

  chunk: int | None = None
  radix_bits: int | None = None
  num_warps: int | None = None

  def __post_init__(self):
    if self.chunk is not None and (self.chunk & (self.chunk - 1) or
                                   not 16 <= self.chunk <= 4096):
      raise ValueError(f"SelectConfig.chunk must be a power of two in [16, 4096], got "
                       f"{self.chunk}")
    if self.radix_bits is not None and self.radix_bits not in _RADIX_BITS:
      raise ValueError(f"SelectConfig.radix_bits must be one of {_RADIX_BITS}, got "
                       f"{self.radix_bits}")
    if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"SelectConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")

  def resolve(self, impl: str) -> tuple[int, int, int]:
    """(chunk, radix_bits, num_warps) with the defaults of ``impl`` filled in."""
    chunk, bits, warps = _DEFAULTS[impl]
    return (self.chunk or chunk, self.radix_bits or bits, self.num_warps or warps)


def validate_select_args(values, counts) -> None:
  if getattr(values, "ndim", None) != 2:
    raise ValueError(f"values must have shape (T, E), got shape {jnp.shape(values)}")
  if values.dtype != jnp.float32:
    raise ValueError(f"values must be float32, got dtype {values.dtype}")
  t, e = values.shape
  if t < 1 or e < 1:
    raise ValueError(f"values must have at least one row and one column, got shape "
                     f"{values.shape}")
  if t >= 2**31 or t * e >= 2**31:
    raise ValueError(f"values has shape {values.shape}; int32 row indices need T * E < 2**31")
  if getattr(counts, "shape", None) != (e,):
    raise ValueError(f"counts must have shape (E,) = ({e},), got shape {jnp.shape(counts)}")
  if not jnp.issubdtype(counts.dtype, jnp.integer):
    raise ValueError(f"counts must be an integer array, got dtype {counts.dtype}")
  if not isinstance(counts, jax.core.Tracer):  # concrete: check the range now
    c = np.asarray(counts)
    if c.size and (c.min() < 0 or c.max() > t):
      raise ValueError(f"counts must lie in [0, T] = [0, {t}], got values in "
                       f"[{c.min()}, {c.max()}]")


def select_top_per_column(values: jax.Array, counts: jax.Array, *, impl: str = "jax_triton",
                          config: SelectConfig | None = None,
                          interpret: bool = False) -> jax.Array:
  """values (T, E) float32, counts (E,) int in [0, T] -> keep (T, E) bool.

  keep[:, e] marks the counts[e] largest values of column e, earlier rows first among equal
  values: bit-identical to ``sonic_jax.routing.select_top_per_column``. Traced counts outside
  [0, T] act as the nearest bound, as in the reference.
  """
  validate_select_args(values, counts)
  tri.validate_impl(impl)
  tri.check_available(impl, interpret)
  config = config or SelectConfig()
  chunk, bits, num_warps = config.resolve(impl)
  num_rows, num_cols = values.shape
  keys = _ordered_key(values).T  # (E, T): a contiguous column per program
  counts = counts.astype(_I32)
  if impl == "pallas_triton":
    from sonic_jax.triton import pallas_kernels as pk
    keep = tri.sequential(pk.select_call(num_rows, num_cols, chunk, bits, num_warps,
                                         bool(interpret)))(keys, counts)
  else:
    from sonic_jax.triton import _jt_kernels as jk
    keep = tri.jax_triton_call(
        keys, counts, scalars=(num_rows,), kernel=jk.select_kernel,
        out_shape=jax.ShapeDtypeStruct((num_cols, num_rows), jnp.int8), grid=(num_cols,),
        num_warps=num_warps, num_stages=1, CHUNK=chunk, BITS=bits)
  return keep.T != 0


__all__ = ["SelectConfig", "select_top_per_column", "validate_select_args"]
