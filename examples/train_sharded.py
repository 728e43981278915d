"""Train the example MoE LM (examples/lm.py) on a device mesh: data + expert (+ FSDP) parallel.

    python examples/train_sharded.py --cpu-devices 8 --steps 20            # fake CPU devices
    python examples/train_sharded.py --data 2 --expert 4 --fsdp 1          # 8 real GPUs
    python examples/train_sharded.py --cpu-devices 8 --fsdp 2 --expert 2 --routing token_rounding

pjit style: one ``jax.jit`` (``nnx.jit``) train step; the batch is a NamedSharding over the token
axes, the MoE parameters are NamedShardings from ``MoESharding.param_specs()`` (experts split
over the expert axis, embed dim over the fsdp axis), other parameters are replicated and XLA
partitions the attention layers from the batch sharding. Each MoE layer runs through
``sonic_jax.sharding.sharded_moe`` (shard_map around the kernel custom_vjp, all_to_all
token exchange). Prints loss and tokens/s (steady state, compile excluded).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lm_cli import add_lm_args, lm_config_kwargs  # noqa: E402  (no jax import)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cpu-devices", type=int, default=0,
                 help="run on this many fake host CPU devices (sets XLA_FLAGS; 0 = real devices)")
  p.add_argument("--data", type=int, default=0, help="data axis size (0: devices / (fsdp·expert))")
  p.add_argument("--fsdp", type=int, default=1, help="fsdp axis size")
  p.add_argument("--expert", type=int, default=0,
                 help="expert axis size (0: largest divisor of both the devices and --experts)")
  p.add_argument("--capacity-factor", type=float, default=None,
                 help="expert-parallel buffer size factor (default: dropless)")
  p.add_argument("--exchange", choices=("dense", "ragged"), default="dense",
                 help="expert-parallel exchange: dense all_to_all or ragged_all_to_all")
  add_lm_args(p, steps=50)
  p.add_argument("--check", action="store_true",
                 help="before training, compare the sharded loss and gradients with the "
                      "unsharded model on one batch")
  return p.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.cpu_devices:
    # Must happen before jax initializes its backends.
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count={args.cpu_devices}").strip()

  import time

  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding

  from lm import (ByteBatches, LMConfig, MoELM, default_dtype, load_text, loss_fn,
                  make_optimizer, train_step)
  from sonic_jax.sharding import MoESharding, place_params, shard_moe_layers
  import sonic_jax

  n_dev = jax.device_count()
  if args.cpu_devices and n_dev != args.cpu_devices:
    raise SystemExit(f"asked for {args.cpu_devices} CPU devices but jax sees {n_dev} (was jax "
                     "imported before this script set XLA_FLAGS?)")
  expert = args.expert or max(k for k in range(1, n_dev + 1)
                              if n_dev % (k * args.fsdp) == 0 and args.experts % k == 0)
  data = args.data or n_dev // (expert * args.fsdp)
  if data * args.fsdp * expert != n_dev:
    raise SystemExit(f"mesh data={data} x fsdp={args.fsdp} x expert={expert} must use all "
                     f"{n_dev} devices")
  mesh = jax.make_mesh((data, args.fsdp, expert), ("data", "fsdp", "expert"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  sharding = MoESharding(mesh, data_axis="data", fsdp_axis="fsdp", expert_axis="expert",
                         capacity_factor=args.capacity_factor, exchange=args.exchange)
  if args.batch % sharding.num_token_shards:
    raise SystemExit(f"--batch {args.batch} must be divisible by the {sharding.num_token_shards} "
                     "token shards (data·fsdp·expert)")

  cfg = LMConfig(**{**lm_config_kwargs(args), "dtype": args.dtype or default_dtype()})
  backend = sonic_jax.resolve_backend(cfg.backend, d=cfg.d_model, n=cfg.d_ff).name
  print(f"devices: {n_dev} x {jax.devices()[0].device_kind} | mesh: data={data} fsdp={args.fsdp} "
        f"expert={expert} | backend: {backend} | dtype: {cfg.dtype} | routing: {cfg.routing}",
        flush=True)

  model = MoELM(cfg, nnx.Rngs(args.seed))
  unsharded = nnx.clone(model) if args.check else None
  replaced = shard_moe_layers(model, sharding)
  place_params(model, sharding)
  w1 = model.blocks[0].moe.w1[...]
  print(f"sharded {replaced} MoE layers; w1 {w1.shape} spec {w1.sharding.spec}, "
        f"tokens spec {sharding.token_spec}", flush=True)

  optimizer = make_optimizer(model, lr=args.lr, steps=args.steps)

  batch_sharding = NamedSharding(mesh, sharding.token_spec)  # (B, S): B over the token axes
  data_iter = ByteBatches(load_text(), cfg.seq_len, args.batch, seed=args.seed)
  if unsharded is not None:
    _check(model, unsharded, data_iter.valid_batch(args.batch), batch_sharding, loss_fn)
    if cfg.routing != "topk":
      print("  (token rounding rounds each device's counts, so sharded != unsharded here)")
  tokens_per_step = args.batch * cfg.seq_len
  losses, times = [], []
  for step in range(args.steps):
    inputs, targets = (jax.device_put(jnp.asarray(a), batch_sharding) for a in data_iter.next())
    t0 = time.perf_counter()
    ce = float(train_step(model, optimizer, inputs, targets))
    dt = time.perf_counter() - t0
    if not math.isfinite(ce):
      raise FloatingPointError(f"loss became {ce} at step {step}")
    losses.append(ce)
    if step >= 2:  # steps 1-2 compile (step 2 may recompile for the updated param layouts)
      times.append(dt)
    if step == 0 or (step + 1) % max(1, args.steps // 10) == 0:
      rate = f"{tokens_per_step / dt:,.0f} tokens/s" if step >= 2 else "(compile)"
      print(f"step {step + 1:4d}  loss {ce:.3f}  {rate}", flush=True)
  steady = tokens_per_step * len(times) / sum(times) if times else float("nan")
  k = max(1, min(5, len(losses) // 2))
  result = dict(devices=n_dev, device_kind=jax.devices()[0].device_kind,
                mesh=dict(data=data, fsdp=args.fsdp, expert=expert), backend=backend,
                dtype=cfg.dtype, routing=cfg.routing, steps=args.steps,
                first_loss=sum(losses[:k]) / k, last_loss=sum(losses[-k:]) / k,
                tokens_per_s=steady)
  print(f"loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}; "
        f"{steady:,.0f} tokens/s (steady state, compile excluded)", flush=True)
  return result


def _check(model, unsharded, batch, batch_sharding, loss_fn):
  """Prints the relative difference of loss and gradients, sharded vs one device."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  @nnx.jit
  def value_and_grad(m, inputs, targets):
    return nnx.value_and_grad(loss_fn, has_aux=True)(m, inputs, targets)

  (loss_s, _), g_s = value_and_grad(model, *(jax.device_put(jnp.asarray(a), batch_sharding)
                                             for a in batch))
  (loss_u, _), g_u = value_and_grad(unsharded, *(jnp.asarray(a) for a in batch))
  flat = lambda g: np.concatenate([np.ravel(np.asarray(a, np.float64))  # noqa: E731
                                   for a in jax.tree.leaves(g)])
  a, b = flat(g_s), flat(g_u)
  print(f"check vs unsharded: loss {float(loss_s):.6f} vs {float(loss_u):.6f}; gradients rel. "
        f"error {np.linalg.norm(a - b) / np.linalg.norm(b):.2e}", flush=True)


if __name__ == "__main__":
  main()
