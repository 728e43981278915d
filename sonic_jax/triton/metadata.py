"""Routing metadata without an argsort: a stable counting sort of pairs by expert.

Pairs j (flat order) are cut into blocks of ``chunk * chunks_per_block``:

1. histogram kernel: counts[b, e] = pairs of expert e in block b.
2. XLA (a few KiB): group_sizes = Σ_b counts, group_offsets = exclusive prefix over experts,
   base[b, e] = group_offsets[e] + Σ_{b' < b} counts[b', e] (exclusive prefix over blocks).
3. scatter kernel: each block walks its chunks in order with a running per-expert row; inside a
   chunk a pair's rank is the number of earlier pairs of the same expert (a chunk x chunk
   comparison), so p = row[e] + rank, stable in j. It writes reverse_idx[j] = p,
   scatter_idx[p] = j and gather_idx[p] = token of j.

The result equals ``RoutingPlan.from_assignments`` bit for bit (same stable order; padding pairs,
a suffix of flat order, keep p = j and token 0).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sonic_jax import triton as tri
from sonic_jax.routing import RoutingPlan, route_logits as xla_route_logits

_I32 = jnp.int32
_TARGET_BLOCKS = 264  # two waves of 132 SMs


@dataclasses.dataclass(frozen=True)
class MetadataConfig:
  """chunk: pairs ranked together (power of two, 16..256; 32 was the fastest of {32, 64, 128}
  on the H200 for both implementations); chunks_per_block: None picks the largest power of two
  <= 16 that still gives ~264 blocks."""

  chunk: int = 32
  chunks_per_block: int | None = None
  num_warps: int = 4

  def __post_init__(self):
    if self.chunk & (self.chunk - 1) or not 16 <= self.chunk <= 256:
      raise ValueError(f"MetadataConfig.chunk must be a power of two in [16, 256], got "
                       f"{self.chunk}")
    if self.chunks_per_block is not None and self.chunks_per_block < 1:
      raise ValueError(f"MetadataConfig.chunks_per_block must be >= 1, got "
                       f"{self.chunks_per_block}")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"MetadataConfig.num_warps must be 1, 2, 4, 8 or 16, got "
                       f"{self.num_warps}")


def _next_pow2(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def _chunks_per_block(num_pairs: int, config: MetadataConfig) -> int:
  if config.chunks_per_block is not None:
    return config.chunks_per_block
  n = 1
  while n < 16 and num_pairs // (config.chunk * n * 2) >= _TARGET_BLOCKS:
    n *= 2
  return n


def validate_metadata_args(expert_ids, num_experts, top_k, token_ids) -> None:
  if getattr(expert_ids, "ndim", None) != 1:
    raise ValueError(f"expert_ids must have shape (P,), got shape {jnp.shape(expert_ids)}")
  if not jnp.issubdtype(expert_ids.dtype, jnp.integer):
    raise ValueError(f"expert_ids must be an integer array, got dtype {expert_ids.dtype}")
  if expert_ids.shape[0] < 1:
    raise ValueError("expert_ids must hold at least one pair")
  if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
    raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
  if expert_ids.shape[0] >= 2**31:
    raise ValueError(f"expert_ids has {expert_ids.shape[0]} pairs; int32 indices need < 2**31")
  if top_k is not None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
      raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if expert_ids.shape[0] % top_k:
      raise ValueError(f"with top_k = {top_k}, expert_ids (P = {expert_ids.shape[0]}) must "
                       f"hold T*K pairs")
  elif getattr(token_ids, "shape", None) != expert_ids.shape:
    raise ValueError(f"token_ids must have the shape of expert_ids {expert_ids.shape} when "
                     f"top_k is None, got {getattr(token_ids, 'shape', None)}")


def routing_metadata(expert_ids: jax.Array, *, num_experts: int, top_k: int | None = None,
                     token_ids: jax.Array | None = None, num_valid: jax.Array | None = None,
                     impl: str = "jax_triton", config: MetadataConfig | None = None,
                     interpret: bool = False):
  """Grouped-order metadata of P pairs in flat order.

  expert_ids: (P,) int, in [0, E) for valid pairs. top_k: pairs are j = t·K + k (token j // K);
  else token_ids (P,) gives each pair's token. num_valid: () int, valid pairs are j < num_valid
  (None: all P).
  Returns (group_sizes (E,), group_offsets (E+1,), gather_idx, scatter_idx, reverse_idx (P,)),
  all int32, equal to ``RoutingPlan.from_assignments``'s.
  """
  validate_metadata_args(expert_ids, num_experts, top_k, token_ids)
  tri.validate_impl(impl)
  tri.check_available(impl, interpret)
  config = config or MetadataConfig()
  num_pairs = expert_ids.shape[0]
  e_pad = max(_next_pow2(num_experts), 2)
  chunk = config.chunk
  nchunk = _chunks_per_block(num_pairs, config)
  num_blocks = -(-num_pairs // (chunk * nchunk))
  keys = expert_ids.astype(_I32)
  nv = jnp.full((1,), num_pairs, _I32) if num_valid is None else (
      jnp.reshape(num_valid, (1,)).astype(_I32))
  tokens = jnp.zeros((1,), _I32) if top_k is not None else token_ids.astype(_I32)
  k_arg = top_k or 0

  if impl == "pallas_triton":
    from sonic_jax.triton import pallas_kernels as pk
    counts = tri.sequential(pk.histogram_call(num_pairs, num_experts, e_pad, chunk, nchunk,
                                              config.num_warps, bool(interpret)))(keys, nv)
  else:
    from sonic_jax.triton import _jt_kernels as jk
    counts = tri.jax_triton_call(
        keys, nv, scalars=(num_pairs,), kernel=jk.histogram_kernel,
        out_shape=jax.ShapeDtypeStruct((num_blocks, e_pad), _I32), grid=(num_blocks,),
        num_warps=config.num_warps, num_stages=1, E=num_experts, E_PAD=e_pad, CHUNK=chunk,
        NCHUNK=nchunk)

  before = jnp.cumsum(counts, axis=0, dtype=_I32) - counts  # exclusive over blocks
  group_sizes = (before[-1] + counts[-1])[:num_experts]
  group_offsets = jnp.concatenate(
      [jnp.zeros((1,), _I32), jnp.cumsum(group_sizes, dtype=_I32)])
  start = jnp.pad(group_offsets[:-1], (0, e_pad - num_experts))
  base = before + start[None, :]

  if impl == "pallas_triton":
    rev, scat, gath = tri.sequential(pk.scatter_call(
        num_pairs, num_experts, e_pad, k_arg, chunk, nchunk, config.num_warps,
        bool(interpret)))(keys, tokens, base, nv)
  else:
    out_shape = tuple(jax.ShapeDtypeStruct((num_pairs,), _I32) for _ in range(3))
    rev, scat, gath = tri.jax_triton_call(
        keys, tokens, base, nv, scalars=(num_pairs,), kernel=jk.scatter_kernel,
        out_shape=out_shape, grid=(num_blocks,), num_warps=config.num_warps, num_stages=1,
        E=num_experts, E_PAD=e_pad, TOP_K=k_arg, CHUNK=chunk, NCHUNK=nchunk)
  return group_sizes, group_offsets, gath, scat, rev


def plan_from_assignments(token_ids: jax.Array, expert_ids: jax.Array, scores: jax.Array, *,
                          num_tokens: int, num_experts: int, valid: jax.Array | None = None,
                          top_k: int | None = None, impl: str = "jax_triton",
                          config: MetadataConfig | None = None,
                          interpret: bool = False) -> RoutingPlan:
  """``RoutingPlan.from_assignments`` with the metadata from ``routing_metadata``.

  Same arguments and result; ``valid`` must be a prefix of flat order (as from_assignments
  documents: valid pairs come first), so the kernels only need its count.
  """
  capacity = expert_ids.shape[0]
  if getattr(token_ids, "shape", None) != (capacity,) or getattr(
      scores, "shape", None) != (capacity,):
    raise ValueError(f"token_ids and scores must have the shape of expert_ids ({capacity},), "
                     f"got {jnp.shape(token_ids)} and {jnp.shape(scores)}")
  if valid is not None and getattr(valid, "shape", None) != (capacity,):
    raise ValueError(f"valid must have shape ({capacity},), got {jnp.shape(valid)}")
  token_ids = token_ids.astype(_I32)
  expert_ids = expert_ids.astype(_I32)
  scores = scores.astype(jnp.float32)
  num_valid = None
  if valid is not None:
    token_ids = jnp.where(valid, token_ids, 0)
    expert_ids = jnp.where(valid, expert_ids, 0)
    scores = jnp.where(valid, scores, 0.0)
    num_valid = jnp.sum(valid, dtype=_I32)
  sizes, offsets, gather_idx, scatter_idx, reverse_idx = routing_metadata(
      expert_ids, num_experts=num_experts, top_k=top_k, token_ids=token_ids,
      num_valid=num_valid, impl=impl, config=config, interpret=interpret)
  if top_k is not None:
    token_offsets = jnp.arange(num_tokens + 1, dtype=_I32) * top_k
  else:
    key = token_ids if valid is None else jnp.where(valid, token_ids, num_tokens)
    token_offsets = jnp.searchsorted(
        key, jnp.arange(num_tokens + 1, dtype=_I32), side="left").astype(_I32)
  return RoutingPlan(scores=scores, token_ids=token_ids, expert_ids=expert_ids,
                     token_offsets=token_offsets, group_sizes=sizes, group_offsets=offsets,
                     gather_idx=gather_idx, scatter_idx=scatter_idx, reverse_idx=reverse_idx,
                     num_tokens=num_tokens, num_experts=num_experts, top_k=top_k)


def route_logits(logits: jax.Array, *, top_k: int, renormalize: bool = True,
                 routing="topk", impl: str = "jax_triton", topk_impl: str | None = None,
                 config: MetadataConfig | None = None, interpret: bool = False) -> RoutingPlan:
  """``sonic_jax.route_logits`` with the top-K and metadata kernels of ``impl``.

  topk_impl: "xla" (``lax.top_k``), "jax_triton" or "pallas_triton" (default: impl).
  Token rounding is not implemented here; such ``routing`` goes to the xla routing.
  """
  from sonic_jax.routing import plan_from_top_k, validate_routing_args
  rounding = validate_routing_args(logits, top_k, routing)
  if rounding is not None:
    return xla_route_logits(logits, top_k=top_k, renormalize=renormalize, routing=rounding)
  tri.validate_impl(impl)
  topk_impl = topk_impl or impl
  if topk_impl != "xla":
    tri.validate_impl(topk_impl)
  num_experts = logits.shape[1]
  if topk_impl == "xla":
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_p, top_e = jax.lax.top_k(probs, top_k)
  else:
    from sonic_jax.triton.topk import topk_softmax
    top_p, top_e = topk_softmax(logits, top_k, impl=topk_impl, interpret=interpret)
  return plan_from_top_k(top_p, top_e, num_experts, renormalize, impl, interpret, config)


__all__ = ["MetadataConfig", "routing_metadata", "plan_from_assignments", "route_logits"]
