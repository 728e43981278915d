"""Command-line options shared by train_lm.py and train_sharded.py (no jax import here, so a
script can still set XLA_FLAGS / JAX_PLATFORMS after parsing its arguments)."""

from __future__ import annotations

import argparse


def add_lm_args(p: argparse.ArgumentParser, *, steps: int) -> None:
  """Model, data and optimizer options of the example LM."""
  p.add_argument("--steps", type=int, default=steps)
  p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--d-model", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--top-k", type=int, default=2)
  p.add_argument("--d-ff", type=int, default=128)
  p.add_argument("--routing", default="topk", choices=["topk", "token_rounding"])
  p.add_argument("--backend", default="auto",
                 choices=["auto", "xla", "pallas", "ffi", "pallas+ffi", "pallas+ffi-wgrad"])
  p.add_argument("--dtype", default=None, help="compute dtype (default: bf16 on GPU, f32 on CPU)")
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--seed", type=int, default=0)


def lm_config_kwargs(args: argparse.Namespace) -> dict:
  """LMConfig fields from the parsed options (dtype None = the device default)."""
  return dict(seq_len=args.seq_len, d_model=args.d_model, num_layers=args.layers,
              d_ff=args.d_ff, num_experts=args.experts, top_k=args.top_k, routing=args.routing,
              backend=args.backend, dtype=args.dtype)
