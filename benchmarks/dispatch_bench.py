"""Row dispatch x (T, d) -> x[gather_idx] (P, d): XLA's gather against sonic_jax.triton.dispatch.

The backward gathers dO (for dh and dW2) and x (for dW1) into grouped order; session 11's kernel
profile put XLA's gather at 1.5 ms each at T=32768, d=4096, K=8 on an H200. This times, at the
shapes of the layer benchmark's configs, with real routing from random logits:

  xla         x[gather_idx] (what the pallas backend runs)
  xla-u32     the same gather on a uint32 view of the rows (two bf16 per element)
  copy        a (P, d) elementwise op (reads and writes P·d elements: the copy ceiling)
  <impl>:<method>:<block_t>x<block_d>:w<warps>   sonic_jax.triton.dispatch
  ffi:gather, ffi:scatter   the ffi backend's CUDA gather_rows / scatter_rows (needs the
                            library: python -m sonic_jax.ffi.build)

each checked bit for bit against xla, GPU time by CUPTI (median), and prints one table per
config with the effective bandwidth of the bytes each method must move. Needs a GPU.

  python benchmarks/dispatch_bench.py --configs paper-120B-n1024,OLMoE-1B-7B --out-dir /tmp/d
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

DEFAULT_VARIANTS = ("xla,xla-u32,copy,"
                    "jax_triton:scatter:1x2048:w4,jax_triton:scatter:1x4096:w8,"
                    "jax_triton:scatter:2x2048:w8,jax_triton:scatter:4x1024:w8,"
                    "jax_triton:scatter:1x1024:w4,jax_triton:gather:4x1024:w4,"
                    "jax_triton:gather:1x2048:w4,pallas_triton:scatter:1x2048:w4")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="paper-120B-n1024,OLMoE-1B-7B")
  ap.add_argument("--variants", default=DEFAULT_VARIANTS)
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--out-dir", default="dispatch_bench_out")
  args = ap.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental.mosaic.gpu import profiler

  from sonic_jax import routing
  from sonic_jax import triton as tri
  from sonic_jax.bench.configs import parse_configs

  if jax.devices()[0].platform != "gpu":
    raise SystemExit("dispatch_bench.py needs a GPU (CUPTI)")
  os.makedirs(args.out_dir, exist_ok=True)
  records = []
  for cfg in parse_configs(args.configs.split(",")):
    kx, kl = jax.random.split(jax.random.key(0))
    x = (0.2 * jax.random.normal(kx, (cfg.T, cfg.d), jnp.float32)).astype(jnp.bfloat16)
    logits = jax.random.normal(kl, (cfg.T, cfg.E), jnp.float32)
    plan = jax.jit(lambda lg: routing.route_logits(lg, top_k=cfg.K))(logits)
    p, d = plan.capacity, cfg.d
    ref = jax.block_until_ready(jax.jit(lambda x_, g: x_[g])(x, plan.gather_idx))
    rows = []
    for spec in args.variants.split(","):
      moved = 2 * p * d * 2  # gather: read P rows (at random), write P rows
      call_args = (x, plan)
      if spec == "xla":
        fn = jax.jit(lambda x_, pl_: x_[pl_.gather_idx])
      elif spec == "xla-u32":
        def fn(x_, pl_):
          u = jax.lax.bitcast_convert_type(x_.reshape(cfg.T, d // 2, 2), jnp.uint32)
          g = u[pl_.gather_idx]
          return jax.lax.bitcast_convert_type(g, jnp.bfloat16).reshape(p, d)
        fn = jax.jit(fn)
      elif spec == "copy":
        call_args = (jnp.tile(x, (p // cfg.T, 1)), plan)
        fn = jax.jit(lambda b, pl_: -b)
      elif spec.startswith("ffi:"):
        from sonic_jax.ffi import ops as ffi_ops
        if spec == "ffi:scatter":
          fn = jax.jit(lambda x_, pl_: ffi_ops.scatter_rows(x_, pl_.reverse_idx))
          moved = (p + cfg.T) * d * 2
        else:
          fn = jax.jit(lambda x_, pl_: ffi_ops.gather_rows(x_, pl_.gather_idx, pl_.group_offsets))
      else:
        impl, method, blocks, warps = spec.split(":")
        bt, bd = (int(v) for v in blocks.split("x"))
        if d % bd:
          continue
        conf = tri.DispatchConfig(method=method, block_t=bt, block_d=bd,
                                  num_warps=int(warps.lstrip("w")))
        fn = jax.jit(lambda x_, pl_, impl=impl, conf=conf: tri.dispatch(x_, pl_, impl=impl,
                                                                         config=conf))
        if method == "scatter":
          moved = (p + cfg.T) * d * 2  # read x once, write P rows
      try:
        out = jax.block_until_ready(fn(*call_args))
      except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
        rows.append({"variant": spec, "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"  {spec}: {rows[-1]['error']}", flush=True)
        continue
      same = spec == "copy" or bool(np.array_equal(np.asarray(out.view(jnp.uint16)),
                                                   np.asarray(ref.view(jnp.uint16))))
      del out
      samples = []
      for _ in range(3):
        _, t = profiler.measure(fn, iterations=args.iters)(*call_args)
        samples += [float(v) for v in (t if isinstance(t, list) else [t])]
      ms = statistics.median(samples)
      rows.append({"variant": spec, "ms": ms, "bytes": moved, "tb_s": moved / ms / 1e9,
                   "bitwise_equal_to_xla": same})
      print(f"  {spec}: {ms:.3f} ms  {moved / ms / 1e9:.2f} TB/s  same={same}", flush=True)
    records.append({"config": cfg.name, "shape": cfg.shape, "P": p, "rows": rows})
    print(f"== {cfg.name} T={cfg.T} d={cfg.d} K={cfg.K} P={p}: dispatch, median of "
          f"{3 * args.iters}")
    for r in rows:
      if "ms" in r:
        print(f"  {r['variant']:40s} {r['ms']:8.3f} ms {r['tb_s']:6.2f} TB/s  "
              f"{'ok' if r['bitwise_equal_to_xla'] else 'DIFFERS'}")
      else:
        print(f"  {r['variant']:40s} {r['error'][:100]}")
  with open(os.path.join(args.out_dir, "dispatch_bench.json"), "w") as f:
    json.dump({"meta": {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
                        "command": " ".join(sys.argv)}, "records": records}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
