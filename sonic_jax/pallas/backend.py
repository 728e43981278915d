"""The ``pallas`` backend: Mosaic GPU kernels behind the kernel contract."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sonic_jax.kernels import ExpertKernels
from sonic_jax.pallas import configs as cfg_lib

_OPERAND_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
ROW_GATHERS = ("auto", "xla", "jax_triton", "pallas_triton")
# What ``validate`` checks with backward=False (dx_pairs is the forward's kernel transposed), and
# the backward kernels it adds by default.
_FORWARD_ENTRIES = ("up_proj", "down_proj", "dx_pairs", "combine")
_BACKWARD_ENTRIES = ("dh", "dw1", "dw2")


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
  """Mosaic GPU grouped GEMMs; ``interpret=True`` runs them in the GPU interpreter on a CPU.

  config: optional ``configs.ForwardConfig`` overriding the per-shape heuristics of the kernels
  (e.g. ``GemmConfig(gather="fused")`` for up_proj, ``DhConfig`` / ``WgradConfig`` for the
  backward); its entries win over ``backward_gathers``.
  backward_gathers: where dh, dW1 and dW2 gather their dO / x rows: "fused" (in the kernels: no
  (T·K, d) gathered copy, the least memory), "xla" (XLA gathers before the kernels, dO's shared
  by dh and dW2) or "auto" (default): "fused" where the layer's forward+backward measured faster
  (or within 2 %, for much less memory) on an H200 — n = 256, or n = 512 with d >= 4096; always
  with n % 256 == 0 and d % 128 == 0 (the two-consumer dW tiling) — else "xla". Measured
  (benchmarks/results/pallas-backward-gathers-h200-2026-12-03-s5.md and
  raw/bench-h200-2026-12-03-pallas-s5.md), fused vs XLA gathers: 30B-256 20.61 vs 22.95 ms,
  6.54 vs 10.30 GiB; 120B-512 37.37 vs 38.35 ms; 30B-512 18.82 vs 18.52 ms, 4.52 vs 6.27 GiB;
  7B-512 3.22 vs 3.03 ms and 1.4B-512 3.01 vs 2.86 ms (so "xla" there); 120B-1024 35.87 vs
  34.12 ms, 4.77 vs 6.76 GiB. "fused-x": only dW1 gathers its x rows in the kernel, dO is
  gathered by XLA once for dh and dW2: the (P, d) gathered x never exists, for a smaller cost
  than "fused" (120B-1024, session 7: 4.77 vs 6.77 GiB, 33.68 vs 33.17 ms; the original
  SonicMoE holds 6.76 GiB there; pallas-train-mixes-h200-2026-12-03-s7.log).
  dw1_last: run dW1 after dW2 and dx (``ExpertKernels.dw1_last``), so that XLA's gathered x is
  never live together with the gathered dO or dX_pairs; default True.
  row_gather: what makes the gathered (P, d) rows of dO and x where the backward kernels (and
  an up_proj config with gather="xla") take them pre-gathered: "xla" (``a[plan.gather_idx]``, XLA's
  gather), a ``sonic_jax.triton.dispatch`` implementation, "jax_triton" or "pallas_triton"
  (top-K plans: each token row read once and written to its K grouped rows), or "auto"
  (default): "pallas_triton" on a GPU (no extra package; jax_triton measured the same), "xla"
  in interpret mode or without a GPU (e.g. lowering for CUDA on a CPU host). H200, session 11 (dispatch-h200-2026-12-04-s11.md): 0.651 against 1.450
  ms for XLA's gather at T=32768, d=4096, K=8 (0.16 / 0.35 ms at T=16384, d=2048, K=8); the
  layer step 36.72 against 38.45 ms there, with gradients bit for bit the same.
  """

  name = "pallas"

  def __init__(self, interpret: bool = False, config: cfg_lib.ForwardConfig | None = None,
               backward_gathers: str = "auto", dw1_last: bool = True,
               row_gather: str = "auto"):
    if backward_gathers not in ("auto", "xla", "fused", "fused-x"):
      raise ValueError(f"backward_gathers must be 'auto', 'xla', 'fused' or 'fused-x', got "
                       f"{backward_gathers!r}")
    if row_gather not in ROW_GATHERS:
      raise ValueError(f"row_gather must be one of {ROW_GATHERS}, got {row_gather!r}")
    if interpret and row_gather == "jax_triton":
      raise ValueError("row_gather='jax_triton' has no CPU interpreter: with interpret=True use "
                       "'xla' or 'pallas_triton'")
    self.interpret = interpret
    self.config = config or cfg_lib.ForwardConfig()
    self.backward_gathers = backward_gathers
    self.dw1_last = bool(dw1_last)
    self.row_gather = row_gather

  def _key(self):
    return (self.interpret, self.config, self.backward_gathers, self.dw1_last, self.row_gather)

  def __hash__(self):
    return hash((type(self),) + self._key())

  def __eq__(self, other):
    return type(other) is type(self) and other._key() == self._key()

  def _gathered(self, a: jax.Array, plan, fused: bool) -> jax.Array | None:
    """a[plan.gather_idx] (P, d) by ``row_gather`` for a kernel that takes its rows
    pre-gathered; None (the kernel gathers with XLA itself, or in the kernel) otherwise."""
    from sonic_jax import triton as tri
    impl = self.row_gather
    if impl == "auto":
      impl = ("pallas_triton" if not self.interpret and tri.pallas_triton_unavailable_reason()
              is None else "xla")
    if fused or impl == "xla":
      return None
    return tri.dispatch(a, plan, impl=impl, interpret=bool(self.interpret))

  def _bwd_gather(self, d: int, n: int, kernel: str | None = None) -> str:
    """The backward's gather mode for shape (d, n) (see ``backward_gathers``): the layer's mode
    ("xla", "fused" or "fused-x"), or with ``kernel`` ("dh", "dw1", "dw2") that kernel's
    ("xla" or "fused")."""
    mode = self.backward_gathers
    if mode == "auto":
      tiles = n % 256 == 0 and d % 128 == 0
      mode = "fused" if tiles and (n <= 256 or (n <= 512 and d >= 4096)) else "xla"
    if mode == "fused-x" and kernel is not None:
      return "fused" if kernel == "dw1" else "xla"
    return mode

  # ------------------------------------------------------------------------------- configs
  def _up_config(self, d, n):
    return self.config.up_proj or cfg_lib.swiglu_gemm_config(d, n)

  def _down_config(self, n, d):
    return self.config.down_proj or cfg_lib.plain_gemm_config(n, d)

  def _dx_config(self, two_n, d):
    return self.config.dx_pairs or cfg_lib.plain_gemm_config(two_n, d, transpose_rhs=True)

  def _combine_config(self, d):
    return self.config.combine or cfg_lib.combine_config(d)

  # The backward kernels' tilings (config overrides, else the per-shape defaults dh / dw1 / dw2
  # pick themselves); validate() checks exactly the configs the entry points below run.
  def _dh_config(self, d, n):
    from sonic_jax.pallas.dh import dh_config_for
    return self.config.dh or dh_config_for(d, n, gather=self._bwd_gather(d, n, "dh"))

  def _dw1_config(self, d, two_n):
    from sonic_jax.pallas.wgrad import wgrad_config_for
    return self.config.dw1 or wgrad_config_for(d, two_n, gather=self._bwd_gather(d, two_n // 2, "dw1"),
                                               gathered="lhs")

  def _dw2_config(self, n, d):
    from sonic_jax.pallas.wgrad import wgrad_config_for
    return self.config.dw2 or wgrad_config_for(n, d, gather=self._bwd_gather(d, n, "dw2"),
                                               gathered="rhs")

  def validate(self, x, plan, w1, w2, *, backward: bool = True) -> None:
    """Raises ValueError (naming the argument and the rule) for shapes these kernels cannot tile.

    backward: also check the backward kernels (dh, dw1, dw2; dx_pairs is always checked), so a
    shape the backward cannot tile fails here, before any kernel runs, rather than in the middle
    of a backward pass. The layer calls this with the default: it cannot know whether the
    forward will be differentiated.
    """
    self.validate_entries(x, plan, w1, w2, _FORWARD_ENTRIES + (_BACKWARD_ENTRIES if backward
                                                                else ()))

  def validate_entries(self, x, plan, w1, w2, entries) -> None:
    """``validate`` for the entry points in ``entries`` only (``MixedKernels``: a shape that
    only an entry point run elsewhere cannot tile is no reason to reject the call)."""
    from sonic_jax.pallas import combine as cb
    from sonic_jax.pallas import grouped_gemm as gg
    for name, a in (("x", x), ("w1", w1), ("w2", w2)):
      if jnp.dtype(a.dtype) not in _OPERAND_DTYPES:
        raise ValueError(f"{name} must be bfloat16 or float16 for backend='pallas', got {a.dtype}")
    if not x.dtype == w1.dtype == w2.dtype:
      raise ValueError(f"x, w1 and w2 must share a dtype for backend='pallas', got {x.dtype}, "
                       f"{w1.dtype}, {w2.dtype}")
    d = x.shape[1]
    n = w2.shape[1]
    if d % 32:
      raise ValueError(f"x.shape[1] (d = {d}) must be a multiple of 32 for backend='pallas'")
    if n % 32:
      raise ValueError(f"w2.shape[1] (n = {n}) must be a multiple of 32 for backend='pallas'")
    if w1.shape[1:] != (d, 2 * n):
      raise ValueError(f"w1 must have shape (E, d, 2n) = (E, {d}, {2 * n}), got {w1.shape}")
    if w2.shape[2] != d:
      raise ValueError(f"w2 must have shape (E, n, d) with d = {d}, got {w2.shape}")
    forward = {
        "up_proj": lambda: gg.validate_gemm(plan.capacity, d, n, self._up_config(d, n),
                                            epilogue="swiglu", what="up_proj (x · w1)"),
        "down_proj": lambda: gg.validate_gemm(plan.capacity, n, d, self._down_config(n, d),
                                              epilogue="none", what="down_proj (A · w2)"),
        "dx_pairs": lambda: gg.validate_gemm(plan.capacity, 2 * n, d,
                                             self._dx_config(2 * n, d), epilogue="none",
                                             what="dx_pairs (dH · w1ᵀ)"),
        "combine": lambda: (cb.validate_combine(d, self._combine_config(d))
                            if self._combine_config(d).impl == "mosaic" else None),
    }
    try:
      for entry, check in forward.items():
        if entry in entries:
          check()
    except ValueError as e:
      raise ValueError(f"x/w1/w2 shapes (d = {d}, n = {n}) cannot be tiled: {e}") from None
    self._validate_backward(d, n, [e for e in _BACKWARD_ENTRIES if e in entries])

  def _validate_backward(self, d: int, n: int, entries) -> None:
    from sonic_jax.pallas import dh as dh_lib
    from sonic_jax.pallas import wgrad as wg_lib
    checks = {
        "dh": ("dh (dout · w2ᵀ, fused dSwiGLU)",
               lambda: dh_lib.validate_dh_shapes(d, n, self._dh_config(d, n))),
        "dw1": ("dw1 (x[gather_idx]ᵀ · dh)",
                lambda: wg_lib.validate_wgrad_shapes(d, 2 * n, self._dw1_config(d, 2 * n),
                                                     ("x[gather_idx]", "dh"), gathered="lhs")),
        "dw2": ("dw2 (a_primeᵀ · dout[gather_idx])",
                lambda: wg_lib.validate_wgrad_shapes(n, d, self._dw2_config(n, d),
                                                     ("a_prime", "dout[gather_idx]"),
                                                     gathered="rhs")),
    }
    for entry in entries:
      what, check = checks[entry]
      try:
        check()
      except ValueError as e:
        raise ValueError(
            f"x.shape[1] (d = {d}) / w2.shape[1] (n = {n}) cannot be tiled by the backward "
            f"kernel {what}: {e}") from None

  # ---------------------------------------------------------------------------- forward
  def up_proj(self, x, w1, plan, *, inference=False):
    from sonic_jax.pallas.grouped_gemm import grouped_gemm
    d, n = x.shape[1], w1.shape[2] // 2
    config = self._up_config(d, n)
    # With an XLA-side gather (config.gather == "xla") the rows come from row_gather too.
    rows = self._gathered(x, plan, config.gather == "fused")
    return grouped_gemm(x if rows is None else rows, w1, plan.group_sizes, plan.group_offsets,
                        num_rows=plan.capacity,
                        gather_idx=plan.gather_idx if rows is None else None, epilogue="swiglu",
                        inference=inference, config=config, interpret=self.interpret)

  def down_proj(self, a, w2, plan):
    from sonic_jax.pallas.grouped_gemm import grouped_gemm
    config = self._down_config(a.shape[1], w2.shape[2])
    return grouped_gemm(a, w2, plan.group_sizes, plan.group_offsets, num_rows=plan.capacity,
                        config=config, interpret=self.interpret)

  def combine(self, y, plan, scores, out_dtype):
    from sonic_jax.pallas.combine import combine
    return combine(y, plan, scores, out_dtype, config=self._combine_config(y.shape[1]),
                   interpret=self.interpret)

  def combine_add(self, y, plan, addend, out_dtype):
    from sonic_jax.pallas.combine import combine
    return combine(y, plan, None, out_dtype, config=self._combine_config(y.shape[1]),
                   interpret=self.interpret, addend=addend)

  def dx_pairs(self, dh, w1, plan):
    from sonic_jax.pallas.grouped_gemm import grouped_gemm
    config = self._dx_config(dh.shape[1], w1.shape[1])
    # w1 (E, d, 2n) is the (E, N, k) transposed rhs of dH (P, 2n) · w1[e]ᵀ.
    return grouped_gemm(dh, w1, plan.group_sizes, plan.group_offsets, num_rows=plan.capacity,
                        transpose_rhs=True, config=config, interpret=self.interpret)

  # --------------------------------------------------------------------------- backward
  # With row_gather != "xla", dh and dw2 each ask for dO's gathered rows; XLA's CSE merges the
  # two identical kernel calls into one, as it does the two XLA gathers.
  def dh(self, dout, w2, h, scores_grouped, plan):
    from sonic_jax.pallas.dh import dh
    config = self._dh_config(dout.shape[1], w2.shape[1])
    return dh(dout, w2, h, scores_grouped, plan, interpret=self.interpret, config=config,
              dout_gathered=self._gathered(dout, plan, config.gather == "fused"))

  def dw2(self, dout, a_prime, plan):
    from sonic_jax.pallas.wgrad import dw2
    config = self._dw2_config(a_prime.shape[1], dout.shape[1])
    return dw2(dout, a_prime, plan, interpret=self.interpret, config=config,
               dout_gathered=self._gathered(dout, plan, config.gather == "fused"))

  def dw1(self, x, dh, plan):
    from sonic_jax.pallas.wgrad import dw1
    config = self._dw1_config(x.shape[1], dh.shape[1])
    return dw1(x, dh, plan, interpret=self.interpret, config=config,
               x_gathered=self._gathered(x, plan, config.gather == "fused"))
