"""Thin jax.ffi.ffi_call wrappers around the CUDA kernels (csrc/ffi_handlers.cu).

Every op takes ``group_offsets`` (E+1,) int32 and reads the live row count on the device, so
they are jit- and CUDA-graph friendly; rows from ``group_offsets[E]`` on are left unwritten.
bf16 operands, fp32 accumulation. Shape rules are checked by FfiKernels.validate and again in C++.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sonic_jax.ffi import _lib, schedules
from sonic_jax.ffi.schedules import FUSED_EPILOGUE_KINDS, GATHER_KINDS, GemmConfig, GemmKind

_BF16, _F32 = jnp.bfloat16, jnp.float32


def _call(name, result_shapes, *args, **attrs):
  _lib.library()  # loads the library and registers the targets on first use
  return jax.ffi.ffi_call(name, result_shapes)(*args, **attrs)


def gather_rows(src: jax.Array, idx: jax.Array, group_offsets: jax.Array) -> jax.Array:
  """src (T, c) bf16, idx (P,) -> (P, c): row p = src[idx[p]] for p < group_offsets[-1]."""
  out = jax.ShapeDtypeStruct((idx.shape[0], src.shape[1]), src.dtype)
  return _call("sonic_jax_gather_rows", out, src, idx.astype(jnp.int32),
               group_offsets.astype(jnp.int32))


def scatter_rows(src: jax.Array, reverse_idx: jax.Array) -> jax.Array:
  """src (T, c) bf16, reverse_idx (T·K,) (a top-K plan's flat pair -> grouped row) -> (T·K, c):
  grouped row reverse_idx[t·K + k] = src[t]. The same rows as gather_rows by gather_idx, with
  src read once in order instead of K times at random."""
  out = jax.ShapeDtypeStruct((reverse_idx.shape[0], src.shape[1]), src.dtype)
  return _call("sonic_jax_scatter_rows", out, src, reverse_idx.astype(jnp.int32))


def grouped_gemm(a: jax.Array, b: jax.Array, group_offsets: jax.Array, kind: GemmKind,
                 config: GemmConfig | int | None = None) -> jax.Array:
  """Grouped GEMM of kind ``kind`` with tile schedule ``config`` (None: schedules.pick).

  varlen-M: a (P, K), b (E, K, N) [NN] or (E, N, K) [NT] -> (P, N).
  varlen-K: a (P, M), b (P, N) -> (E, M, N), fp32 or bf16 by kind.
  """
  kind = GemmKind(kind)
  if kind in GATHER_KINDS:
    raise ValueError(f"kind {kind.name} gathers its A rows: call gathered_grouped_gemm")
  if kind in FUSED_EPILOGUE_KINDS:
    raise ValueError(f"kind {kind.name} has a fused epilogue: call up_proj_swiglu or dh_dswiglu")
  if kind == GemmKind.VARLEN_K_GATHER_BF16:
    raise ValueError(f"kind {kind.name} reads rows through indices: call gathered_varlen_k")
  num_groups = group_offsets.shape[0] - 1
  if kind in schedules.VARLEN_K_KINDS:
    out_shape = (num_groups, a.shape[1], b.shape[1])
    dims = out_shape[1:]
  elif kind in (GemmKind.VARLEN_M_NN_F32, GemmKind.VARLEN_M_NN_BF16):
    out_shape = (a.shape[0], b.shape[2])
    dims = (b.shape[2], a.shape[1])
  else:
    out_shape = (a.shape[0], b.shape[1])
    dims = (b.shape[1], a.shape[1])
  if config is None:
    config = schedules.pick(kind, *dims)
  config = schedules.check(kind, config)
  out_dtype = _F32 if kind in schedules.F32_OUT_KINDS else _BF16
  ws = _lib.gemm_workspace_bytes(int(kind), int(config), num_groups)
  out, _ = _call("sonic_jax_grouped_gemm",
                 (jax.ShapeDtypeStruct(out_shape, out_dtype),
                  jax.ShapeDtypeStruct((ws,), jnp.uint8)),
                 a, b, group_offsets.astype(jnp.int32), kind=np.int32(int(kind)),
                 config=np.int32(int(config)))
  return out


def gathered_grouped_gemm(src: jax.Array, gather_idx: jax.Array, b: jax.Array,
                          group_offsets: jax.Array, kind: GemmKind,
                          config: GemmConfig | int | None = None) -> jax.Array:
  """Varlen-M grouped GEMM reading its A rows through ``gather_idx`` (no (P, K) copy).

  src (T, K) bf16, gather_idx (P,) int, b (E, K, N) [VARLEN_M_GATHER_NN_BF16, bf16 out] or
  (E, N, K) [VARLEN_M_GATHER_NT_F32, fp32 out] -> (P, N) with
  out[p] = src[gather_idx[p]] · op(b[e]) for p in group e; rows from group_offsets[-1] on are
  left unwritten. config None: schedules.pick.
  """
  kind = GemmKind(kind)
  if kind not in GATHER_KINDS:
    raise ValueError(f"kind must be one of {[k.name for k in GATHER_KINDS]}, got {kind.name}")
  nt = kind == GemmKind.VARLEN_M_GATHER_NT_F32
  if src.ndim != 2 or gather_idx.ndim != 1 or b.ndim != 3 or group_offsets.ndim != 1:
    raise ValueError(f"need src (T, K), gather_idx (P,), b (E, ., .), group_offsets (E+1,); got "
                     f"src {src.shape}, gather_idx {gather_idx.shape}, b {b.shape}, "
                     f"group_offsets {group_offsets.shape}")
  num_groups = group_offsets.shape[0] - 1
  k, n = (b.shape[2], b.shape[1]) if nt else (b.shape[1], b.shape[2])
  b_form = "(E, N, K)" if nt else "(E, K, N)"
  if b.shape[0] != num_groups or k != src.shape[1]:
    raise ValueError(f"b must be {b_form} with E = group_offsets.shape[0] - 1 = {num_groups} and "
                     f"K = src.shape[1] = {src.shape[1]}, got b {b.shape}")
  if k % 8 or n % 8:
    raise ValueError(f"K and N must be multiples of 8 (16-byte cp.async chunks), got K={k}, N={n}")
  for arg, arr in (("src", src), ("b", b)):
    if arr.dtype != _BF16:
      raise ValueError(f"{arg} must be bf16, got {arr.dtype}")
  if config is None:
    config = schedules.pick(kind, n, k)
  config = schedules.check(kind, config)
  ws = _lib.gemm_workspace_bytes(int(kind), int(config), num_groups)
  out, _ = _call("sonic_jax_gathered_grouped_gemm",
                 (jax.ShapeDtypeStruct((gather_idx.shape[0], n), _F32 if nt else _BF16),
                  jax.ShapeDtypeStruct((ws,), jnp.uint8)),
                 src, gather_idx.astype(jnp.int32), b, group_offsets.astype(jnp.int32),
                 kind=np.int32(int(kind)), config=np.int32(int(config)))
  return out


def gathered_varlen_k(a: jax.Array, a_idx: jax.Array | None, b: jax.Array,
                      b_idx: jax.Array | None, group_offsets: jax.Array,
                      config: GemmConfig | int | None = None) -> jax.Array:
  """Varlen-K grouped GEMM (weight gradients) reading either operand's rows through an index.

  a (Ta, M) bf16, b (Tb, N) bf16, a_idx / b_idx (P,) int or None (row p itself; the operand then
  has P rows), group_offsets (E + 1,) -> (E, M, N) bf16 with
  out[e] = Σ_{p in group e} a[a_idx[p]]ᵀ ⊗ b[b_idx[p]] (fp32 accumulation); empty groups give
  zeros, indices outside the operand read zero rows. dW1 = gathered_varlen_k(x, gather_idx, dH,
  None, ...), dW2 = gathered_varlen_k(A', None, dO, gather_idx, ...): no (P, d) gathered copy.
  config None: the operand without an index (b first) by TMA multicast when a_idx or b_idx is
  None, on the tile whose 128-wide side is the gathered operand (schedules.IN_ORDER_WGRAD:
  GATHER_TMA_B_128x256_C2x1 for b in order, GATHER_TMA_256x128_C2x1 for a), else
  GATHER_COOP_128x256 (both by cp.async).
  """
  kind = GemmKind.VARLEN_K_GATHER_BF16
  if a.ndim != 2 or b.ndim != 2 or group_offsets.ndim != 1:
    raise ValueError(f"need a (Ta, M), b (Tb, N), group_offsets (E+1,); got a {a.shape}, "
                     f"b {b.shape}, group_offsets {group_offsets.shape}")
  rows = []
  for arg, arr, idx in (("a", a, a_idx), ("b", b, b_idx)):
    if arr.dtype != _BF16:
      raise ValueError(f"{arg} must be bf16, got {arr.dtype}")
    if idx is not None and (idx.ndim != 1 or idx.shape[0] == 0):
      raise ValueError(f"{arg}_idx must be None or a non-empty (P,) index, got {idx.shape}")
    rows.append(arr.shape[0] if idx is None else idx.shape[0])
  if rows[0] != rows[1]:
    raise ValueError(f"a and b must cover as many grouped rows (through their index, else their "
                     f"own rows), got {rows[0]} and {rows[1]}")
  m, n = a.shape[1], b.shape[1]
  if m % 8 or n % 8:
    raise ValueError(f"M = a.shape[1] and N = b.shape[1] must be multiples of 8 (16-byte "
                     f"cp.async chunks), got M={m}, N={n}")
  num_groups = group_offsets.shape[0] - 1
  in_order = a_idx is None or b_idx is None
  if config is None:  # an operand read in order (dW1's dH, dW2's A'): by TMA multicast
    if in_order:
      config = schedules.IN_ORDER_WGRAD["b" if b_idx is None else "a"]
    else:
      config = schedules.pick(kind, m, n)
  config = schedules.check(kind, config)
  if config in schedules.IN_ORDER_WGRAD_CONFIGS and not in_order:
    raise ValueError(f"config {config.name} loads one operand's rows in order by TMA: "
                     "a_idx or b_idx must be None (else use GATHER_COOP_128x256)")
  # The operands read by cp.async (those with an index; both where no operand goes by TMA) are
  # addressed by 32-bit row offsets in 16-byte units.
  for arg, arr, idx in (("a", a, a_idx), ("b", b, b_idx)):
    by_cp_async = idx is not None or config not in schedules.IN_ORDER_WGRAD_CONFIGS
    if by_cp_async and arr.shape[0] * (arr.shape[1] // 8) >= 2**32 - 1:
      raise ValueError(f"{arg} {arr.shape} is too large for the gathered varlen-K kernel: it "
                       f"addresses the rows it copies in 32-bit counts of 16-byte chunks "
                       f"(rows x columns / 8 must stay below 2**32 - 1)")
  ws = _lib.gemm_workspace_bytes(int(kind), int(config), num_groups)
  none = jnp.zeros((0,), jnp.int32)
  out, _ = _call("sonic_jax_gathered_varlen_k",
                 (jax.ShapeDtypeStruct((num_groups, m, n), _BF16),
                  jax.ShapeDtypeStruct((ws,), jnp.uint8)),
                 a, none if a_idx is None else a_idx.astype(jnp.int32), b,
                 none if b_idx is None else b_idx.astype(jnp.int32),
                 group_offsets.astype(jnp.int32), config=np.int32(int(config)))
  return out


def _fused_rows(name: str, src: jax.Array, gather_idx: jax.Array | None, b: jax.Array,
                b_name: str, b_form: str, group_offsets: jax.Array, k: int, n: int,
                rows: int | None = None) -> tuple[int, jax.Array, int]:
  """Checks shared by the fused-epilogue GEMMs (b is the weight operand ``b_name`` of shape
  ``b_form``, rows the output rows P when the caller knows them); returns (P, the int32 index
  to pass, 1 if the kernel gathers through it else 0)."""
  if src.ndim != 2 or b.ndim != 3 or group_offsets.ndim != 1:
    raise ValueError(f"{name}: need src (T, K), {b_name} {b_form} and group_offsets (E+1,); got "
                     f"src {src.shape}, {b_name} {b.shape}, group_offsets {group_offsets.shape}")
  for arg, arr in (("src", src), (b_name, b)):
    if arr.dtype != _BF16:
      raise ValueError(f"{name}: {arg} must be bf16, got {arr.dtype}")
  num_groups = group_offsets.shape[0] - 1
  if b.shape[0] != num_groups or k != src.shape[1]:
    raise ValueError(f"{name}: {b_name} must be {b_form} with E = group_offsets.shape[0] - 1 = "
                     f"{num_groups} and K = src.shape[1] = {src.shape[1]}, got {b.shape}")
  if k % 8 or n % 8:
    raise ValueError(f"{name}: K and n must be multiples of 8 (16-byte cp.async chunks), got "
                     f"K={k}, n={n}")
  if gather_idx is None:
    if rows is not None and src.shape[0] != rows:
      raise ValueError(f"{name}: without gather_idx, src must hold the {rows} gathered rows, got "
                       f"src {src.shape}")
    return src.shape[0], jnp.zeros((1,), jnp.int32), 0  # the index buffer is not read
  if gather_idx.ndim != 1 or (rows is not None and gather_idx.shape[0] != rows):
    raise ValueError(f"{name}: gather_idx must be (P,) with P = {rows}, got {gather_idx.shape}")
  return gather_idx.shape[0], gather_idx.astype(jnp.int32), 1


def up_proj_swiglu(src: jax.Array, gather_idx: jax.Array | None, w1: jax.Array,
                   group_offsets: jax.Array, *, write_h: bool = True,
                   config: GemmConfig | int | None = None
                   ) -> tuple[jax.Array | None, jax.Array]:
  """up_proj in one kernel: H = src[gather_idx] · w1[e] (P, 2n) bf16 and A = silu(gate)·up
  (P, n) bf16 (from the bf16 H, as the backward recomputes it) written by the GEMM's epilogue.

  src (T, d) with gather_idx (P,), or the gathered rows (P, d) with gather_idx None; w1
  (E, d, 2n) bf16 in the concat layout. write_h=False (inference) writes only A and returns
  (None, A). Rows from group_offsets[-1] on are left unwritten. The configs in
  schedules.SWIGLU_IN_ORDER_CONFIGS load src by TMA and need gather_idx None.
  """
  if w1.ndim != 3 or w1.shape[2] % 2:
    raise ValueError(f"up_proj_swiglu: w1 must be (E, d, 2n), got {w1.shape}")
  n = w1.shape[2] // 2
  p, idx, gathered = _fused_rows("up_proj_swiglu", src, gather_idx, w1, "w1", "(E, d, 2n)",
                                 group_offsets, w1.shape[1], n)
  kind = GemmKind.VARLEN_M_GATHER_SWIGLU
  config = schedules.check(kind, schedules.pick(kind, n, w1.shape[1]) if config is None
                           else config)
  if gathered and config in schedules.SWIGLU_IN_ORDER_CONFIGS:
    raise ValueError(f"up_proj_swiglu: config {config.name} loads src's rows in order by TMA: "
                     "pass the gathered rows (P, d) with gather_idx=None")
  ws = _lib.gemm_workspace_bytes(int(kind), int(config), group_offsets.shape[0] - 1)
  h, a, _ = _call("sonic_jax_up_proj_swiglu",
                  (jax.ShapeDtypeStruct((p if write_h else 0, 2 * n), _BF16),
                   jax.ShapeDtypeStruct((p, n), _BF16), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
                  src, idx, w1, group_offsets.astype(jnp.int32), config=np.int32(int(config)),
                  gathered=np.int32(gathered))
  return (h if write_h else None), a


def dh_dswiglu(src: jax.Array, gather_idx: jax.Array | None, w2: jax.Array, h: jax.Array,
               s: jax.Array, group_offsets: jax.Array,
               config: GemmConfig | int | None = None
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """dh in one kernel: dA' = dO[gather_idx] · w2[e]ᵀ stays in the accumulators; the epilogue
  loads H and s and writes dH = s·dSwiGLU(dA') (P, 2n) bf16, A' = s·A (P, n) bf16 and per-tile
  sums of dS = ⟨dA', A⟩, which are added here -> dS (P,) fp32.

  src dO (T, d) with gather_idx (P,), or (P, d) with gather_idx None; w2 (E, n, d) bf16;
  h (P, 2n) bf16; s (P,) scores in grouped order.
  """
  if w2.ndim != 3:
    raise ValueError(f"dh_dswiglu: w2 must be (E, n, d), got {w2.shape}")
  n, k = w2.shape[1], w2.shape[2]
  if h.ndim != 2 or h.shape[1] != 2 * n or h.dtype != _BF16:
    raise ValueError(f"dh_dswiglu: h must be (P, 2n) = (P, {2 * n}) bf16, got {h.shape} {h.dtype}")
  p = h.shape[0]
  if s.shape != (p,):
    raise ValueError(f"dh_dswiglu: s must be (P,) = ({p},), got {s.shape}")
  _, idx, gathered = _fused_rows("dh_dswiglu", src, gather_idx, w2, "w2", "(E, n, d)",
                                 group_offsets, k, n, rows=p)
  kind = GemmKind.VARLEN_M_GATHER_DSWIGLU
  config = schedules.check(kind, schedules.pick(kind, n, k) if config is None else config)
  ws = _lib.gemm_workspace_bytes(int(kind), int(config), group_offsets.shape[0] - 1)
  tile_n = _lib.fused_tile_n(int(kind), int(config))
  dh, a_prime, ds_part, _ = _call(
      "sonic_jax_dh_dswiglu",
      (jax.ShapeDtypeStruct((p, 2 * n), _BF16), jax.ShapeDtypeStruct((p, n), _BF16),
       jax.ShapeDtypeStruct((p, -(-n // tile_n)), _F32), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
      src, idx, w2, h, s.astype(_F32), group_offsets.astype(jnp.int32),
      config=np.int32(int(config)), gathered=np.int32(gathered))
  return dh, a_prime, jnp.sum(ds_part, axis=1)


def swiglu(acc: jax.Array, group_offsets: jax.Array, *, write_h: bool = True
           ) -> tuple[jax.Array | None, jax.Array]:
  """acc (P, 2n) fp32 -> (H (P, 2n) bf16 or None, A = silu(gate)·up (P, n) bf16)."""
  p, two_n = acc.shape
  offs = group_offsets.astype(jnp.int32)
  a_shape = jax.ShapeDtypeStruct((p, two_n // 2), _BF16)
  if write_h:
    h, a = _call("sonic_jax_swiglu_ha", (jax.ShapeDtypeStruct((p, two_n), _BF16), a_shape),
                 acc, offs)
    return h, a
  return None, _call("sonic_jax_swiglu_a", a_shape, acc, offs)


def swiglu_from_h(h: jax.Array, group_offsets: jax.Array) -> jax.Array:
  """h (P, 2n) bf16 -> A = silu(gate)·up (P, n) bf16, computed in fp32 from the bf16 H."""
  p, two_n = h.shape
  return _call("sonic_jax_swiglu_from_h", jax.ShapeDtypeStruct((p, two_n // 2), _BF16), h,
               group_offsets.astype(jnp.int32))


def dswiglu(da: jax.Array, h: jax.Array, s: jax.Array, group_offsets: jax.Array, *,
            warp_per_row: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
  """da (P, n) fp32, h (P, 2n) bf16, s (P,) fp32 -> dH (P, 2n), A' (P, n) bf16, dS (P,) fp32.

  warp_per_row: a warp per row instead of a 256-thread block per row (the same dH and A'; dS
  summed in another order); FfiKernels' default since session 20 (docs/ffi.md).
  """
  p, n = da.shape
  return _call("sonic_jax_dswiglu",
               (jax.ShapeDtypeStruct((p, 2 * n), _BF16), jax.ShapeDtypeStruct((p, n), _BF16),
                jax.ShapeDtypeStruct((p,), _F32)),
               da, h, s.astype(_F32), group_offsets.astype(jnp.int32),
               warp_per_row=np.int32(bool(warp_per_row)))


def combine(y: jax.Array, token_offsets: jax.Array, reverse_idx: jax.Array,
            scores: jax.Array | None, num_tokens: int) -> jax.Array:
  """out[t] = Σ_{j in token t} s_j · y[reverse_idx[j]] -> (T, c) bf16 (fp32 accumulation)."""
  out = jax.ShapeDtypeStruct((num_tokens, y.shape[1]), _BF16)
  args = (y, token_offsets.astype(jnp.int32), reverse_idx.astype(jnp.int32))
  if scores is None:
    return _call("sonic_jax_combine_unweighted", out, *args)
  return _call("sonic_jax_combine_weighted", out, *args, scores.astype(_F32))


def combine_add(y: jax.Array, token_offsets: jax.Array, reverse_idx: jax.Array,
                addend: jax.Array) -> jax.Array:
  """out[t] = addend[t] + Σ_{j in token t} y[reverse_idx[j]] -> (T, c) bf16 (fp32 accumulation);
  addend (T, c) bf16."""
  out = jax.ShapeDtypeStruct(addend.shape, _BF16)
  return _call("sonic_jax_combine_add", out, y, token_offsets.astype(jnp.int32),
               reverse_idx.astype(jnp.int32), addend.astype(_BF16))
