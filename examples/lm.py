"""A small decoder-only Transformer LM with sonic_jax MoE layers, and offline byte-level text.

Shared by train_lm.py (single device) and train_sharded.py (mesh). The text is the Python
documentation that ships with CPython itself (``pydoc_data.topics``), so it exists offline.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import sonic_jax
from sonic_jax.nn import MoE


@dataclasses.dataclass(frozen=True)
class LMConfig:
  vocab: int = 256  # bytes
  seq_len: int = 128
  d_model: int = 128
  num_heads: int = 4
  num_layers: int = 2
  d_ff: int = 128  # per-expert intermediate size n
  num_experts: int = 8
  top_k: int = 2
  routing: str = "topk"
  aux_loss_coef: float = 0.01
  backend: str = "auto"
  dtype: str = "float32"  # compute dtype; params stay float32


def load_text() -> bytes:
  """~1 MB of English prose: the Python reference docs bundled with the interpreter."""
  from pydoc_data import topics
  return "\n\n".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")


class ByteBatches:
  """Random windows of a byte string: (inputs, targets) int32 (batch, seq_len)."""

  def __init__(self, data: bytes, seq_len: int, batch: int, seed: int = 0, holdout: float = 0.05):
    arr = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    cut = int(len(arr) * (1 - holdout))
    self.train, self.valid = arr[:cut], arr[cut:]
    self.seq_len, self.batch = seq_len, batch
    self.rng = np.random.default_rng(seed)

  def _sample(self, arr, batch):
    starts = self.rng.integers(0, len(arr) - self.seq_len - 1, size=batch)
    win = np.stack([arr[s:s + self.seq_len + 1] for s in starts])
    return win[:, :-1], win[:, 1:]

  def next(self):
    return self._sample(self.train, self.batch)

  def valid_batch(self, batch: int):
    return self._sample(self.valid, batch)


class Block(nnx.Module):
  def __init__(self, cfg: LMConfig, rngs: nnx.Rngs):
    dtype = jnp.dtype(cfg.dtype)
    self.norm1 = nnx.RMSNorm(cfg.d_model, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(cfg.num_heads, cfg.d_model, dtype=dtype, decode=False,
                                       rngs=rngs)
    self.norm2 = nnx.RMSNorm(cfg.d_model, rngs=rngs)
    self.moe = MoE(cfg.d_model, cfg.d_ff, cfg.num_experts, cfg.top_k, rngs=rngs, dtype=dtype,
                   routing=cfg.routing, backend=cfg.backend, aux_loss_coef=cfg.aux_loss_coef)

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask).astype(x.dtype)
    out, aux = self.moe(self.norm2(x), return_aux_loss=True)
    return x + out.astype(x.dtype), aux


class MoELM(nnx.Module):
  """Token embedding, num_layers × (attention + MoE), tied output projection."""

  def __init__(self, cfg: LMConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab, cfg.d_model, rngs=rngs)
    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (cfg.seq_len, cfg.d_model)))
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.norm = nnx.RMSNorm(cfg.d_model, rngs=rngs)

  def __call__(self, tokens):
    """tokens (B, S) int32 -> (logits (B, S, vocab) f32, summed aux loss)."""
    x = self.embed(tokens) + self.pos[...][: tokens.shape[1]]
    mask = nnx.make_causal_mask(tokens)
    aux = jnp.zeros((), jnp.float32)
    for block in self.blocks:
      x, a = block(x, mask)
      aux = aux + a
    return self.embed.attend(self.norm(x)).astype(jnp.float32), aux


def loss_fn(model: MoELM, inputs, targets):
  logits, aux = model(inputs)
  ce = jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))
  return ce + aux, ce


def make_optimizer(model: MoELM, *, lr: float, steps: int) -> nnx.Optimizer:
  """AdamW with linear warm-up and cosine decay to lr/10."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(50, steps // 10 + 1), steps,
                                                end_value=lr * 0.1)
  return nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param)


@nnx.jit
def train_step(model: MoELM, optimizer: nnx.Optimizer, inputs, targets):
  """One AdamW step; returns the cross-entropy (without the aux loss)."""
  (_, ce), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, inputs, targets)
  optimizer.update(model, grads)
  return ce


def default_dtype() -> str:
  """bf16 compute on GPUs, f32 on CPUs."""
  return "bfloat16" if jax.default_backend() == "gpu" else "float32"


def resolved_backend_name(backend: str, d: int | None = None, n: int | None = None) -> str:
  """The backend a (d, n) MoE layer runs on (``backend="auto"`` picks per shape)."""
  return sonic_jax.resolve_backend(backend, d=d, n=n).name
