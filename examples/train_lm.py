"""Main job: train a small MoE Transformer LM on the Python docs with sonic_jax MoE layers.

    python examples/train_lm.py                 # CPU: a few minutes; GPU: picks its kernels
    python examples/train_lm.py --steps 50 --routing token_rounding

Prints a progress bar with loss and tokens/s, evaluates on held-out text, and saves a loss
curve PNG and a JSON log under --out (default runs/train_lm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from lm_cli import add_lm_args, lm_config_kwargs  # noqa: E402
from lm import (ByteBatches, LMConfig, MoELM, default_dtype, load_text, loss_fn,  # noqa: E402
                make_optimizer, resolved_backend_name, train_step)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_lm_args(p, steps=300)
  p.add_argument("--out", default="runs/train_lm")
  return p.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  cfg = LMConfig(**{**lm_config_kwargs(args), "dtype": args.dtype or default_dtype()})
  backend = resolved_backend_name(cfg.backend, cfg.d_model, cfg.d_ff)
  print(f"device: {jax.devices()[0].device_kind} | backend: {backend} | dtype: {cfg.dtype} | "
        f"routing: {cfg.routing}", flush=True)

  data = ByteBatches(load_text(), cfg.seq_len, args.batch, seed=args.seed)
  model = MoELM(cfg, nnx.Rngs(args.seed))
  optimizer = make_optimizer(model, lr=args.lr, steps=args.steps)

  @nnx.jit
  def eval_step(model, inputs, targets):
    return loss_fn(model, inputs, targets)[1]

  tokens_per_step = args.batch * cfg.seq_len
  losses, t_start = [], time.perf_counter()
  bar = tqdm(range(args.steps), desc="train", dynamic_ncols=True, mininterval=1.0)
  for step in bar:
    inputs, targets = data.next()
    t0 = time.perf_counter()
    ce = float(train_step(model, optimizer, jnp.asarray(inputs), jnp.asarray(targets)))
    dt = time.perf_counter() - t0
    if not math.isfinite(ce):
      raise FloatingPointError(f"loss became {ce} at step {step}")
    losses.append(ce)
    if step > 0:
      bar.set_postfix(loss=f"{ce:.3f}", tok_s=f"{tokens_per_step / dt:,.0f}")
  wall = time.perf_counter() - t_start

  vin, vtg = data.valid_batch(64)
  model.eval()
  valid = float(eval_step(model, jnp.asarray(vin), jnp.asarray(vtg)))
  first, last = sum(losses[:10]) / min(10, len(losses)), sum(losses[-10:]) / min(10, len(losses))
  result = dict(backend=backend, device=jax.devices()[0].device_kind, dtype=cfg.dtype,
                routing=cfg.routing, steps=args.steps, first_loss=first, last_loss=last,
                valid_loss=valid, tokens_per_s=args.steps * tokens_per_step / wall, losses=losses)
  print(f"loss {first:.3f} -> {last:.3f} (held-out {valid:.3f}), "
        f"{result['tokens_per_s']:,.0f} tokens/s overall incl. compile", flush=True)

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "log.json"), "w") as f:
    json.dump(result, f)
  _plot(losses, os.path.join(args.out, "loss.png"), title=f"{backend} / {cfg.routing}")
  print(f"wrote {args.out}/loss.png and log.json")
  return result


def _plot(losses, path, title):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.5))
  ax.plot(losses, lw=1)
  ax.set_xlabel("step")
  ax.set_ylabel("train cross-entropy (nats/byte)")
  ax.set_title(f"sonic_jax MoE LM ({title})")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
