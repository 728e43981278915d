"""The same kernels as _jt_kernels.py written for Pallas' Triton lowering (``pl.pallas_call`` with
``plgpu_triton.CompilerParams``). They need no jax-triton, and run on a CPU with
``interpret=True``. Every ref is the whole array (no BlockSpecs: the Triton lowering needs
power-of-two blocks, and E or K need not be one); loads and stores are explicitly masked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

_F32 = jnp.float32
_I32 = jnp.int32


def _call(body, out_shape, grid, num_warps, interpret):
  return pl.pallas_call(
      body, out_shape=out_shape, grid=grid,
      compiler_params=plgpu_triton.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret)


@functools.cache
def topk_softmax_call(num_rows: int, e: int, e_pad: int, k: int, block_t: int, num_warps: int,
                      interpret: bool):
  """(T, E_PAD) logits (columns >= E ignored; the wrapper pads E to E_PAD) ->
  (probs (T, K) f32, experts (T, K) i32)."""

  def body(x_ref, p_ref, e_ref):
    t0 = pl.program_id(0) * block_t
    rows = t0 + jnp.arange(block_t, dtype=_I32)
    cols = jnp.arange(e_pad, dtype=_I32)
    row_ok = rows < num_rows
    mask = row_ok[:, None] & (cols[None, :] < e)
    x = plgpu_triton.load(x_ref.at[pl.ds(t0, block_t), :], mask=mask, other=-jnp.inf)
    x = x.astype(_F32)
    m = jnp.where(row_ok, jnp.max(x, axis=1), 0.0)
    denom = jnp.sum(jnp.exp(x - m[:, None]), axis=1)
    taken = jnp.broadcast_to(cols[None, :] >= e, (block_t, e_pad))
    for kk in range(k):
      cand = jnp.where(taken, -jnp.inf, x)
      best = jnp.max(cand, axis=1)
      hit = (cand == best[:, None]) & jnp.logical_not(taken)
      idx = jnp.min(jnp.where(hit, cols[None, :], e_pad), axis=1)
      p = jnp.exp(best - m) / denom
      kk_ = jnp.int32(kk)  # an array index: the interpreter rejects a Python int here
      plgpu_triton.store(p_ref.at[pl.ds(t0, block_t), kk_], p, mask=row_ok)
      plgpu_triton.store(e_ref.at[pl.ds(t0, block_t), kk_], idx, mask=row_ok)
      taken = taken | (cols[None, :] == idx[:, None])

  out_shape = (jax.ShapeDtypeStruct((num_rows, k), _F32),
               jax.ShapeDtypeStruct((num_rows, k), _I32))
  return _call(body, out_shape, (pl.cdiv(num_rows, block_t),), num_warps, interpret)


@functools.cache
def histogram_call(num_pairs: int, e: int, e_pad: int, chunk: int, nchunk: int, num_warps: int,
                   interpret: bool):
  """keys (P,), num_valid (1,) -> counts (num_blocks, E_PAD) per block of nchunk * chunk pairs."""
  num_blocks = pl.cdiv(num_pairs, chunk * nchunk)

  def body(keys_ref, nv_ref, counts_ref):
    b = pl.program_id(0)
    nv = nv_ref[0]
    bins = jnp.arange(e_pad, dtype=_I32)
    ii = jnp.arange(chunk, dtype=_I32)

    def step(c, acc):
      j0 = (b * nchunk + c) * chunk
      j = j0 + ii
      ok = (j < nv) & (j < num_pairs)
      key = plgpu_triton.load(keys_ref.at[pl.ds(j0, chunk)], mask=ok, other=e_pad)
      return acc + jnp.sum((key[:, None] == bins[None, :]).astype(_I32), axis=0)

    acc = lax.fori_loop(0, nchunk, step, jnp.zeros((e_pad,), _I32))
    counts_ref[b, :] = acc

  out_shape = jax.ShapeDtypeStruct((num_blocks, e_pad), _I32)
  return _call(body, out_shape, (num_blocks,), num_warps, interpret)


@functools.cache
def scatter_call(num_pairs: int, e: int, e_pad: int, top_k: int, chunk: int, nchunk: int,
                 num_warps: int, interpret: bool):
  """keys (P,), tokens (P,) or (1,), base (num_blocks, E_PAD), num_valid (1,) ->
  (reverse_idx, scatter_idx, gather_idx), each (P,) int32. See _jt_kernels.scatter_kernel."""
  num_blocks = pl.cdiv(num_pairs, chunk * nchunk)

  def body(keys_ref, tokens_ref, base_ref, nv_ref, rev_ref, scat_ref, gath_ref):
    b = pl.program_id(0)
    nv = nv_ref[0]
    bins = jnp.arange(e_pad, dtype=_I32)
    ii = jnp.arange(chunk, dtype=_I32)
    run0 = base_ref[b, :]

    def step(c, run):
      j0 = (b * nchunk + c) * chunk
      j = j0 + ii
      in_range = j < num_pairs
      ok = (j < nv) & in_range
      key = plgpu_triton.load(keys_ref.at[pl.ds(j0, chunk)], mask=ok, other=e_pad)
      onehot = key[:, None] == bins[None, :]
      start = jnp.sum(jnp.where(onehot, run[None, :], 0), axis=1)
      earlier = (key[:, None] == key[None, :]) & (ii[None, :] < ii[:, None])
      rank = jnp.sum(earlier.astype(_I32), axis=1)
      p = jnp.where(ok, start + rank, j)
      if top_k > 0:
        tok = j // top_k
      else:
        tok = plgpu_triton.load(tokens_ref.at[pl.ds(j0, chunk)], mask=in_range, other=0)
      plgpu_triton.store(rev_ref.at[pl.ds(j0, chunk)], p, mask=in_range)
      plgpu_triton.store(scat_ref.at[p], j, mask=in_range)
      plgpu_triton.store(gath_ref.at[p], tok, mask=in_range)
      return run + jnp.sum(onehot.astype(_I32), axis=0)

    lax.fori_loop(0, nchunk, step, run0)

  out_shape = tuple(jax.ShapeDtypeStruct((num_pairs,), _I32) for _ in range(3))
  return _call(body, out_shape, (num_blocks,), num_warps, interpret)


@functools.cache
def combine_call(num_tokens: int, num_rows: int, d: int, k: int, weighted: bool, dtype,
                 out_dtype, block_t: int, block_d: int, num_warps: int, interpret: bool):
  """reverse (T, K), [scores (T, K) f32], y (P, d) -> out (T, d): Σ_k s · y[reverse] in fp32."""
  del num_rows

  def body(*refs):
    if weighted:
      rev_ref, s_ref, y_ref, o_ref = refs
    else:
      rev_ref, y_ref, o_ref = refs
    t0 = pl.program_id(0) * block_t
    c0 = pl.program_id(1) * block_d
    t_ok = (t0 + jnp.arange(block_t, dtype=_I32)) < num_tokens
    cols = c0 + jnp.arange(block_d, dtype=_I32)
    acc = jnp.zeros((block_t, block_d), _F32)
    for kk in range(k):
      kk = jnp.int32(kk)  # an array index: the interpreter rejects a Python int here
      row = plgpu_triton.load(rev_ref.at[pl.ds(t0, block_t), kk], mask=t_ok, other=0)
      # Both indices as arrays: the interpreter cannot mix an index array with a slice.
      y = plgpu_triton.load(y_ref.at[row[:, None], cols[None, :]], mask=t_ok[:, None], other=0)
      y = y.astype(_F32)
      if weighted:
        s = plgpu_triton.load(s_ref.at[pl.ds(t0, block_t), kk], mask=t_ok, other=0.0)
        y = y * s[:, None]
      acc = acc + y
    plgpu_triton.store(o_ref.at[pl.ds(t0, block_t), pl.ds(c0, block_d)], acc.astype(out_dtype),
                       mask=t_ok[:, None])

  del dtype
  out_shape = jax.ShapeDtypeStruct((num_tokens, d), out_dtype)
  return _call(body, out_shape, (pl.cdiv(num_tokens, block_t), d // block_d), num_warps,
               interpret)


@functools.cache
def dispatch_scatter_call(num_tokens: int, d: int, k: int, dtype, block_t: int, block_d: int,
                          num_warps: int, interpret: bool):
  """reverse (T, K), x (T, d) -> out (T·K, d): out[reverse[t, k]] = x[t]."""

  def body(rev_ref, x_ref, o_ref):
    t0 = pl.program_id(0) * block_t
    c0 = pl.program_id(1) * block_d
    t_ok = (t0 + jnp.arange(block_t, dtype=_I32)) < num_tokens
    cols = c0 + jnp.arange(block_d, dtype=_I32)
    x = plgpu_triton.load(x_ref.at[pl.ds(t0, block_t), pl.ds(c0, block_d)], mask=t_ok[:, None],
                          other=0)
    for kk in range(k):
      kk = jnp.int32(kk)  # an array index: the interpreter rejects a Python int here
      row = plgpu_triton.load(rev_ref.at[pl.ds(t0, block_t), kk], mask=t_ok, other=0)
      plgpu_triton.store(o_ref.at[row[:, None], cols[None, :]], x, mask=t_ok[:, None])

  out_shape = jax.ShapeDtypeStruct((num_tokens * k, d), dtype)
  return _call(body, out_shape, (pl.cdiv(num_tokens, block_t), d // block_d), num_warps,
               interpret)


@functools.cache
def dispatch_gather_call(num_rows: int, d: int, dtype, block_r: int, block_d: int,
                         num_warps: int, interpret: bool):
  """gather (P,), x (T, d) -> out (P, d): out[p] = x[gather[p]]."""

  def body(g_ref, x_ref, o_ref):
    r0 = pl.program_id(0) * block_r
    c0 = pl.program_id(1) * block_d
    r_ok = (r0 + jnp.arange(block_r, dtype=_I32)) < num_rows
    cols = c0 + jnp.arange(block_d, dtype=_I32)
    src = plgpu_triton.load(g_ref.at[pl.ds(r0, block_r)], mask=r_ok, other=0)
    x = plgpu_triton.load(x_ref.at[src[:, None], cols[None, :]], mask=r_ok[:, None], other=0)
    plgpu_triton.store(o_ref.at[pl.ds(r0, block_r), pl.ds(c0, block_d)], x, mask=r_ok[:, None])

  out_shape = jax.ShapeDtypeStruct((num_rows, d), dtype)
  return _call(body, out_shape, (pl.cdiv(num_rows, block_r), d // block_d), num_warps,
               interpret)


@functools.cache
def select_call(num_rows: int, num_cols: int, chunk: int, bits: int, num_warps: int,
                interpret: bool):
  """keys (E, T) int32 (order-preserving, a column per row), counts (E,) int32 ->
  keep (E, T) int8: per row e, its clip(counts[e], 0, T) largest keys, earlier first among equal
  ones. Radix select; see sonic_jax/triton/select.py and _jt_kernels.select_kernel. Pallas-Triton
  has no histogram, so each pass counts ge[b] = #{candidates with digit >= b} directly (a
  (chunk, 2**bits) comparison), which is what the digit choice needs. Each loop carries the next
  chunk's keys, loaded before the current chunk's work (Triton does not pipeline these loads)."""
  nbins = 1 << bits
  nchunk = pl.cdiv(num_rows, chunk)

  def body(keys_ref, counts_ref, out_ref):
    e = pl.program_id(0)
    r = jnp.clip(counts_ref[e], 0, num_rows)
    ii = jnp.arange(chunk, dtype=_I32)
    bins = jnp.arange(nbins, dtype=_I32)

    def load(c):
      ok = c * chunk + ii < num_rows
      return plgpu_triton.load(keys_ref.at[e, pl.ds(c * chunk, chunk)], mask=ok, other=0)

    prefix, rem = jnp.int32(0), r  # digits of the r-th largest key so far; rank among candidates
    for p in range(32 // bits):
      shift = 32 - bits * (p + 1)

      def count(c, carry, prefix=prefix, shift=shift, first=p == 0):
        ge, k = carry
        k_next = load(c + 1)
        ok = c * chunk + ii < num_rows
        d = (k >> shift) & (nbins - 1)
        if first:
          d = d ^ (nbins >> 1)  # the sign bit: unsigned digit order = signed key order
        else:  # candidates share the digits found so far
          ok = ok & ((k >> (shift + bits)) == (prefix >> (shift + bits)))
        d = jnp.where(ok, d, -1)
        return ge + jnp.sum((d[:, None] >= bins[None, :]).astype(_I32), axis=0), k_next

      ge, _ = lax.fori_loop(0, nchunk, count, (jnp.zeros((nbins,), _I32), load(0)))
      b = jnp.sum((ge >= rem).astype(_I32)) - 1  # ge is non-increasing; ge[0] >= rem
      rem = rem - jnp.sum(jnp.where(bins == b + 1, ge, 0))  # minus candidates above digit b
      prefix = prefix | ((b ^ (nbins >> 1) if p == 0 else b) << shift)

    def write(c, carry):
      run, k = carry
      k_next = load(c + 1)
      ok = c * chunk + ii < num_rows
      eq = ok & (k == prefix)
      rank = run + jnp.cumsum(eq.astype(_I32))  # 1-based among all rows equal to the cut
      keep = ok & ((k > prefix) | (eq & (rank <= rem))) & (r > 0)
      plgpu_triton.store(out_ref.at[e, pl.ds(c * chunk, chunk)], keep.astype(jnp.int8), mask=ok)
      return run + jnp.sum(eq.astype(_I32)), k_next

    lax.fori_loop(0, nchunk, write, (jnp.int32(0), load(0)))

  out_shape = jax.ShapeDtypeStruct((num_cols, num_rows), jnp.int8)
  return _call(body, out_shape, (num_cols,), num_warps, interpret)
