"""Fused softmax + top-K over router logits (T, E) -> fp32 probabilities and expert ids (T, K).

One program handles ``block_t`` rows held in registers (E padded to a power of two). Selection is
K rounds of (row max, lowest column attaining it): the largest logits first, ties to the lower
expert, which is ``jax.lax.top_k``'s order on the softmax probabilities except where fp32
rounding makes two different logits' probabilities equal (then XLA breaks the tie by index and
this kernel by the logit). Probabilities are exp(l - max) / Σ exp(l - max) in fp32.

Differentiable in the logits: the backward is XLA (softmax Jacobian restricted to the K
selected columns), so the kernel only runs forward.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from sonic_jax import triton as tri
from sonic_jax.routing import softmax_top_k_grad

MAX_EXPERTS = 4096  # one row lives in registers


@dataclasses.dataclass(frozen=True)
class TopKConfig:
  """block_t: rows per program (a power of two). The defaults, one row per single-warp
  program, were the fastest of the H200 sweep (block_t, num_warps) in {(1, 1), (4, 4), (64, 8),
  (4096 / E, 4)}: 17.5 µs (jax-triton) / 18.0 µs (Pallas-Triton) at T = 24576, E = 128, K = 8 and
  73 µs (jax-triton) at T = 32768, E = 256, K = 16, vs 30 / 28 / 216 µs with (4096 / E rows,
  4 warps); see benchmarks/results/triton-h200-2026-12-02-s2.md."""

  block_t: int = 1
  num_warps: int = 1

  def __post_init__(self):
    if self.block_t < 1 or self.block_t & (self.block_t - 1):
      raise ValueError(f"TopKConfig.block_t must be a power of two, got {self.block_t}")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"TopKConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


def _next_pow2(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def validate_topk(logits, top_k) -> None:
  if getattr(logits, "ndim", None) != 2:
    raise ValueError(f"logits must have shape (T, E), got shape {jnp.shape(logits)}")
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"logits must be floating point, got dtype {logits.dtype}")
  e = logits.shape[1]
  if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
    raise ValueError(f"top_k must be an int with 1 <= top_k <= E ({e}), got {top_k!r}")
  if e > MAX_EXPERTS:
    raise ValueError(f"logits has E = {e} experts; the top-K kernel holds a row in registers "
                     f"and supports E <= {MAX_EXPERTS}")
  if logits.shape[0] < 1:
    raise ValueError(f"logits must have at least one row, got shape {logits.shape}")


def topk_softmax(logits: jax.Array, top_k: int, *, impl: str = "jax_triton",
                 config: TopKConfig | None = None,
                 interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """logits (T, E) float -> (probs (T, K) float32, experts (T, K) int32), best first.

  probs are softmax(logits) at the selected experts (not renormalized).
  """
  validate_topk(logits, top_k)
  tri.validate_impl(impl)
  tri.check_available(impl, interpret)
  return _topk(logits, top_k, impl, config or TopKConfig(), interpret)


def _launch(logits, top_k, impl, config: TopKConfig, interpret):
  num_rows, e = logits.shape
  e_pad = max(_next_pow2(e), 2)
  block_t = config.block_t
  if impl == "pallas_triton":
    from sonic_jax.triton import pallas_kernels as pk
    x = logits if e == e_pad else jnp.pad(logits, ((0, 0), (0, e_pad - e)))
    return tri.sequential(pk.topk_softmax_call(num_rows, e, e_pad, top_k, block_t,
                                               config.num_warps, bool(interpret)))(x)
  from sonic_jax.triton import _jt_kernels as jk
  out_shape = (jax.ShapeDtypeStruct((num_rows, top_k), jnp.float32),
               jax.ShapeDtypeStruct((num_rows, top_k), jnp.int32))
  return tri.jax_triton_call(
      logits, scalars=(num_rows,), kernel=jk.topk_softmax_kernel, out_shape=out_shape,
      grid=(-(-num_rows // block_t),), num_warps=config.num_warps, num_stages=1, E=e,
      E_PAD=e_pad, K=top_k, BLOCK_T=block_t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _topk(logits, top_k, impl, config, interpret):
  return tuple(_launch(logits, top_k, impl, config, interpret))


def _topk_fwd(logits, top_k, impl, config, interpret):
  probs, experts = _launch(logits, top_k, impl, config, interpret)
  return (probs, experts), (logits, probs, experts)


def _topk_bwd(top_k, impl, config, interpret, res, g):
  del top_k, impl, config, interpret
  logits, probs, experts = res
  return (softmax_top_k_grad(logits, probs, experts, g[0]).astype(logits.dtype),)


_topk.defvjp(_topk_fwd, _topk_bwd)

__all__ = ["TopKConfig", "topk_softmax", "validate_topk", "MAX_EXPERTS"]
