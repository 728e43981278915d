"""Triton kernels called through jax-triton (imported only when ``triton`` and ``jax_triton`` are).

Five families, each a plain ``@triton.jit`` function; the JAX wrappers (shapes, validation,
launch grids) are in topk.py, metadata.py, combine.py, dispatch.py and select.py. Parameter order is
jax-triton's: the inputs as passed to ``triton_call`` (arrays and scalars in that order), then
the outputs, then the constexprs. All index math that can exceed 2**31 (row * d) is done in
int64.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_softmax_kernel(logits_ptr, num_rows, probs_ptr, experts_ptr,
                        E: tl.constexpr, E_PAD: tl.constexpr, K: tl.constexpr,
                        BLOCK_T: tl.constexpr):
  """BLOCK_T rows of (T, E) logits -> top-K softmax probabilities (T, K) fp32, experts (T, K).

  Selection is on the fp32 logits (softmax is monotone), largest first, ties to the lower
  expert; a ``taken`` mask (not a -inf overwrite) keeps -inf logits selectable exactly once.
  """
  rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
  cols = tl.arange(0, E_PAD)
  row_ok = rows < num_rows
  mask = row_ok[:, None] & (cols[None, :] < E)
  ptrs = logits_ptr + rows[:, None].to(tl.int64) * E + cols[None, :]
  x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
  m = tl.max(x, axis=1)
  m = tl.where(row_ok, m, 0.0)  # masked rows: avoid -inf - -inf
  denom = tl.sum(tl.exp(x - m[:, None]), axis=1)
  taken = (cols[None, :] >= E) | (rows[:, None] < 0)  # (BLOCK_T, E_PAD): padding columns
  for k in tl.static_range(K):
    cand = tl.where(taken, float("-inf"), x)
    best = tl.max(cand, axis=1)
    hit = (cand == best[:, None]) & (taken == 0)
    idx = tl.min(tl.where(hit, cols[None, :], E_PAD), axis=1)
    p = tl.exp(best - m) / denom
    tl.store(probs_ptr + rows * K + k, p, mask=row_ok)
    tl.store(experts_ptr + rows * K + k, idx, mask=row_ok)
    taken = taken | (cols[None, :] == idx[:, None])


@triton.jit
def histogram_kernel(keys_ptr, num_valid_ptr, num_pairs, counts_ptr,
                     E: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                     NCHUNK: tl.constexpr):
  """counts[b, e] = #{valid j in block b : keys[j] == e} for e < E_PAD (zero from E on);
  block b = NCHUNK * CHUNK pairs."""
  pid = tl.program_id(0)
  nv = tl.load(num_valid_ptr)
  ii = tl.arange(0, CHUNK)
  acc = tl.zeros((E_PAD,), tl.int32)
  for c in tl.range(NCHUNK):
    j = (pid * NCHUNK + c) * CHUNK + ii
    ok = (j < nv) & (j < num_pairs)
    e = tl.load(keys_ptr + j, mask=ok, other=0)
    acc += tl.histogram(e, E_PAD, mask=ok)
  tl.store(counts_ptr + pid * E_PAD + tl.arange(0, E_PAD), acc)


@triton.jit
def scatter_kernel(keys_ptr, tokens_ptr, base_ptr, num_valid_ptr, num_pairs,
                   reverse_ptr, scatter_ptr, gather_ptr,
                   E: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                   CHUNK: tl.constexpr, NCHUNK: tl.constexpr):
  """Stable counting-sort scatter: grouped row p = base[b, e] + rank of j among e's pairs.

  base[b, e] is the first grouped row of expert e's pairs from block b (group offset plus the
  counts of earlier blocks). Inside a block, chunks run in order with a running (E,) count;
  inside a chunk, the rank is the number of earlier pairs with the same expert (tl.histogram
  and tl.gather keep the running counts in registers, no one-hot (chunk, E) tile). Pairs past
  num_valid (padding, a suffix) keep p = j. TOP_K > 0: token = j // TOP_K, else tokens[j].
  """
  pid = tl.program_id(0)
  nv = tl.load(num_valid_ptr)
  ii = tl.arange(0, CHUNK)
  run = tl.load(base_ptr + pid * E_PAD + tl.arange(0, E_PAD))
  for c in tl.range(NCHUNK):
    j = (pid * NCHUNK + c) * CHUNK + ii
    in_range = j < num_pairs
    ok = (j < nv) & in_range
    e = tl.load(keys_ptr + j, mask=ok, other=0)
    start = tl.gather(run, e, 0)  # run[e], from registers
    earlier = (e[:, None] == e[None, :]) & (ii[None, :] < ii[:, None])
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    p = tl.where(ok, start + rank, j)
    if TOP_K > 0:
      tok = j // TOP_K
    else:
      tok = tl.load(tokens_ptr + j, mask=in_range, other=0)
    tl.store(reverse_ptr + j, p, mask=in_range)
    tl.store(scatter_ptr + p, j, mask=in_range)
    tl.store(gather_ptr + p, tok, mask=in_range)
    run += tl.histogram(e, E_PAD, mask=ok)


@triton.jit
def combine_kernel(y_ptr, reverse_ptr, scores_ptr, num_tokens, out_ptr,
                   D: tl.constexpr, K: tl.constexpr, WEIGHTED: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
  """out[t, cols] = Σ_k s[t, k] · y[reverse[t·K + k], cols] in fp32 (top-K plans).

  D % BLOCK_D == 0 (checked by the wrapper), so the column mask is dropped and each thread's
  contiguous bf16 columns become 16-byte loads (jax-triton passes 16-byte aligned pointers).
  """
  t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
  c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
  t_ok = t < num_tokens
  acc = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)
  for k in tl.static_range(K):
    row = tl.load(reverse_ptr + t * K + k, mask=t_ok, other=0)
    y = tl.load(y_ptr + row[:, None].to(tl.int64) * D + c[None, :], mask=t_ok[:, None],
                other=0.0).to(tl.float32)
    if WEIGHTED:
      s = tl.load(scores_ptr + t * K + k, mask=t_ok, other=0.0)
      y = y * s[:, None]
    acc += y
  out = out_ptr + t[:, None].to(tl.int64) * D + c[None, :]
  tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=t_ok[:, None])


@triton.jit
def dispatch_scatter_kernel(x_ptr, reverse_ptr, num_tokens, out_ptr,
                            D: tl.constexpr, K: tl.constexpr,
                            BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
  """out[reverse[t·K + k], cols] = x[t, cols] for k < K (top-K plans): x is read once, in order,
  and each of its rows is written to the token's K grouped rows (whole 16-byte vectors; D %
  BLOCK_D == 0 is checked by the wrapper)."""
  t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
  c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
  t_ok = t < num_tokens
  x = tl.load(x_ptr + t[:, None].to(tl.int64) * D + c[None, :], mask=t_ok[:, None], other=0.0)
  for k in tl.static_range(K):
    row = tl.load(reverse_ptr + t * K + k, mask=t_ok, other=0)
    tl.store(out_ptr + row[:, None].to(tl.int64) * D + c[None, :], x, mask=t_ok[:, None])


@triton.jit
def dispatch_gather_kernel(x_ptr, gather_ptr, num_rows, out_ptr,
                           D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
  """out[p, cols] = x[gather[p], cols]: grouped rows written in order, x rows read by index."""
  r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
  c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
  r_ok = r < num_rows
  src = tl.load(gather_ptr + r, mask=r_ok, other=0)
  x = tl.load(x_ptr + src[:, None].to(tl.int64) * D + c[None, :], mask=r_ok[:, None], other=0.0)
  tl.store(out_ptr + r[:, None].to(tl.int64) * D + c[None, :], x, mask=r_ok[:, None])


@triton.jit
def select_kernel(keys_ptr, counts_ptr, num_rows, keep_ptr,
                  CHUNK: tl.constexpr, BITS: tl.constexpr):
  """Row e of keys (E, T) int32 (order-preserving) -> keep[e] (int8): its clip(counts[e], 0, T)
  largest keys, earlier rows first among equal ones. Radix select, most significant digit first
  (see sonic_jax/triton/select.py): pass p histograms BITS-bit digit p of the rows that share
  the digits chosen so far; then one pass writes the mask. Triton does not pipeline these loads
  (no dot), so every loop loads the next chunk before working on the current one."""
  pid = tl.program_id(0)
  keys = keys_ptr + pid.to(tl.int64) * num_rows
  keep_out = keep_ptr + pid.to(tl.int64) * num_rows
  r = tl.minimum(tl.maximum(tl.load(counts_ptr + pid), 0), num_rows)
  ii = tl.arange(0, CHUNK)
  bins = tl.arange(0, 1 << BITS)
  prefix = r * 0  # digits of the r-th largest key found so far, in key bit positions
  rem = r  # its rank among the rows that share them
  for p in tl.static_range(32 // BITS):
    shift = 32 - BITS * (p + 1)
    hist = tl.zeros((1 << BITS,), tl.int32)
    k = tl.load(keys + ii, mask=ii < num_rows, other=0)
    for t0 in tl.range(0, num_rows, CHUNK):
      t = t0 + ii
      k_next = tl.load(keys + t + CHUNK, mask=t + CHUNK < num_rows, other=0)
      ok = t < num_rows
      d = (k >> shift) & ((1 << BITS) - 1)
      if p == 0:
        d = d ^ (1 << (BITS - 1))  # the sign bit: unsigned digit order = signed key order
      else:
        ok = ok & ((k >> (shift + BITS)) == (prefix >> (shift + BITS)))
      hist += tl.histogram(d, 1 << BITS, mask=ok)
      k = k_next
    ge = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # ge[b] = #{candidates, digit >= b}
    b = tl.sum((ge >= rem).to(tl.int32), 0) - 1  # the largest b with ge[b] >= rem
    rem -= tl.sum(tl.where(bins > b, hist, 0), 0)
    if p == 0:
      b = b ^ (1 << (BITS - 1))
    prefix = prefix | (b << shift)
  run = r * 0  # rows equal to the cut seen in earlier chunks
  k = tl.load(keys + ii, mask=ii < num_rows, other=0)
  for t0 in tl.range(0, num_rows, CHUNK):
    t = t0 + ii
    k_next = tl.load(keys + t + CHUNK, mask=t + CHUNK < num_rows, other=0)
    ok = t < num_rows
    eq = (ok & (k == prefix)).to(tl.int32)
    rank = run + tl.cumsum(eq, 0)  # 1-based among the rows equal to the cut
    keep = ok & ((k > prefix) | ((eq != 0) & (rank <= rem))) & (r > 0)
    tl.store(keep_out + t, keep.to(tl.int8), mask=ok)
    run += tl.sum(eq, 0)
    k = k_next
