"""Backend variants named on the command line of the diagnostic benchmarks.

``xla``, a ``backends.COMBINED`` name (``pallas+ffi``, ``pallas+ffi-wgrad``), ``auto`` (``backend="auto"``: per config the
backend ``sonic_jax.auto_order(d, n)`` picks), or ``pallas[:<backward_gathers>][:<option>...]``.
Options: ``dw1-early`` (dW1 where XLA schedules it, ``PallasKernels(dw1_last=False)``),
``dh-ring`` (dh on the warp-specialized ring kernel fed by TMA, ``DhConfig(ring=True)``, 3
stages), ``row_gather=<impl>`` (the backward's
pre-gathered dO / x rows: ``PallasKernels(row_gather=...)``, xla, jax_triton or
pallas_triton; default auto), ``pingpong[=<kernel>[/<kernel>...]]`` (the forward GEMMs named,
default up_proj, down_proj and dx_pairs, on ``configs.pingpong_config``'s ping-pong ring
tiling) and ``<kernel>.<field>=<value>`` (one field of that kernel's config for the problem's
shape replaced, after pingpong; kernels up_proj, down_proj, dx_pairs, dh, dw1, dw2; values
int, true / false or a word). Examples: ``pallas:fused-x``, ``pallas::dh-ring``,
``pallas::dh.block_n=64:dh.ctas_per_sm=2``, ``pallas::up_proj.block_k=32``,
``pallas::row_gather=jax_triton``, ``pallas::pingpong=up_proj``.

``ffi[:<option>...]``: the ffi backend with options ``dw1-last`` (``FfiKernels(dw1_last=True)``),
``fused-gather[=<up_proj|dh>]``, ``wgrad-gather[=<dw1|dw2>]`` (``FfiKernels(wgrad_gather=True)``,
or for one entry point),
``row_gather=<scatter|gather>``, ``fused_epilogue=<none|dh|up_proj|both>``,
``dswiglu=<block|warp>``,
``gather_schedule=<auto|tma_b|cp_async|noinc|tma_b_c1|pingpong|pingpong_c1>``,
``combine_add=<kernel|xla>``, ``up_proj_epilogue=<separate|gemm|gemm_pingpong>`` and
``schedule=<kind>@<config>`` (repeatable:
``FfiKernels(schedules={kind: config})``), e.g. ``ffi:dw1-last``,
``ffi:fused_epilogue=dh:gather_schedule=tma_b`` or
``ffi:schedule=VARLEN_M_NN_BF16@COOPERATIVE_128x256_C2x1``.

``<spec>+<entry>[/<entry>...]=<spec>[+...]``: ``sonic_jax.mixed.MixedKernels``, the first spec's
backend with the named entry points (up_proj, down_proj, combine, dh, dw2, dx_pairs, dw1) taken
from the other, e.g. ``pallas+dx_pairs/dw1=ffi`` or ``pallas+dh/dw2=ffi:dswiglu=warp``.
"""

from __future__ import annotations

import dataclasses
import re

OPTIONS = ("dw1-early", "dh-ring", "row_gather=<impl>", "pingpong[=<kernel>[/<kernel>...]]",
           "<kernel>.<field>=<value>")
KERNELS = ("up_proj", "down_proj", "dx_pairs", "dh", "dw1", "dw2")
PINGPONG_KERNELS = ("up_proj", "down_proj", "dx_pairs")


def _pingpong_kernels(opts: list[str], spec: str) -> list[str]:
  """The kernels that the ``pingpong[=a/b]`` options of ``spec`` name (all three forward
  GEMMs for a bare ``pingpong``); SystemExit on another name."""
  out = []
  for o in opts:
    if o == "pingpong":
      out += PINGPONG_KERNELS
    elif o.startswith("pingpong="):
      names = o.split("=", 1)[1].split("/")
      if not all(k in PINGPONG_KERNELS for k in names):
        raise SystemExit(f"variant {spec!r}: pingpong= takes kernels from "
                         f"{', '.join(PINGPONG_KERNELS)} joined by '/', got {o!r}")
      out += names
  return list(dict.fromkeys(out))


def _pingpong_configs(names: list[str], d: int, n: int) -> dict:
  """configs.pingpong_config for each forward GEMM named, at model width d, expert width n."""
  from sonic_jax.pallas import configs as cfg_lib
  shapes = {"up_proj": (d, n, "swiglu"), "down_proj": (n, d, "none"),
            "dx_pairs": (2 * n, d, "none")}
  return {k: cfg_lib.pingpong_config(shapes[k][0], shapes[k][1], epilogue=shapes[k][2])
          for k in names}
_FIELD_RE = re.compile(r"^(\w+)\.(\w+)=([\w-]+)$")


def _value(text: str):
  if text.isdigit():
    return int(text)
  return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _field(opt: str) -> tuple[str, str, object] | None:
  """'dh.block_n=64' -> ('dh', 'block_n', 64); None when it is not a field option."""
  m = _FIELD_RE.match(opt)
  if not m or m.group(1) not in KERNELS:
    return None
  return m.group(1), m.group(2), _value(m.group(3))


def _base_configs(kern, d: int, n: int) -> dict:
  """Each kernel's config as ``kern`` runs it for model width d and expert width n."""
  return {"up_proj": kern._up_config(d, n), "down_proj": kern._down_config(n, d),
          "dx_pairs": kern._dx_config(2 * n, d), "dh": kern._dh_config(d, n),
          "dw1": kern._dw1_config(d, 2 * n), "dw2": kern._dw2_config(n, d)}


FFI_OPTIONS = ("dw1-last", "fused-gather[=<up_proj|dh>]", "wgrad-gather[=<dw1|dw2>]",
               "row_gather=<scatter|gather>",
               "fused_epilogue=<none|dh|up_proj|both>", "dswiglu=<block|warp>",
               "gather_schedule=<auto|tma_b|cp_async|noinc|tma_b_c1|pingpong|pingpong_c1>",
               "combine_add=<kernel|xla>",
               "up_proj_epilogue=<separate|gemm|gemm_pingpong>", "schedule=<kind>@<config>")


def _ffi_kernels(spec: str):
  """'ffi[:<option>...]' -> FfiKernels; SystemExit on an unknown option."""
  kw = {}
  for o in spec.split(":")[1:]:
    if o == "dw1-last":
      kw["dw1_last"] = True
    elif o == "fused-gather" or o.startswith("fused-gather="):
      kw["fused_gather"] = o.split("=", 1)[1] if "=" in o else True
    elif o == "wgrad-gather" or o.startswith("wgrad-gather="):
      kw["wgrad_gather"] = o.split("=", 1)[1] if "=" in o else True
    elif o.startswith("row_gather="):
      kw["row_gather"] = o.split("=", 1)[1]
    elif o.startswith("fused_epilogue="):
      kw["fused_epilogue"] = o.split("=", 1)[1]
    elif o.startswith("dswiglu="):
      kw["dswiglu"] = o.split("=", 1)[1]
    elif o.startswith("gather_schedule="):
      kw["gather_schedule"] = o.split("=", 1)[1]
    elif o.startswith("combine_add="):
      kw["combine_add"] = o.split("=", 1)[1]
    elif o.startswith("up_proj_epilogue="):
      kw["up_proj_epilogue"] = o.split("=", 1)[1]
    elif o.startswith("schedule=") and "@" in o:
      kind, config = o.split("=", 1)[1].split("@", 1)
      kw.setdefault("schedules", {})[kind] = config
    elif o:
      raise SystemExit(f"unknown variant {spec!r}: ffi[:<option>...] with options "
                       f"{', '.join(FFI_OPTIONS)}")
  from sonic_jax.ffi.backend import FfiKernels
  try:
    return FfiKernels(**kw)
  except ValueError as e:
    raise SystemExit(f"variant {spec!r}: {e}") from None


def kernels_for(spec: str, d: int | None = None, n: int | None = None):
  """The ExpertKernels (or backend name) that ``spec`` names for model width ``d`` and expert
  width ``n`` (needed by the config options); SystemExit on a bad spec."""
  from sonic_jax.backends import COMBINED
  if spec in ("xla", "auto") or spec in COMBINED:
    return spec
  if "+" in spec:
    return _mixed_kernels(spec, d, n)
  if spec == "ffi" or spec.startswith("ffi:"):
    return _ffi_kernels(spec)
  name, *rest = spec.split(":")
  gathers, opts = (rest[0] if rest else "") or "auto", rest[1:]
  row_gather = "auto"
  for o in opts:
    if o.startswith("row_gather="):
      row_gather = o.split("=", 1)[1]
  opts = [o for o in opts if not o.startswith("row_gather=")]
  pingpong = _pingpong_kernels(opts, spec)
  opts = [o for o in opts if o != "pingpong" and not o.startswith("pingpong=")]
  fields = [_field(o) for o in opts if o not in OPTIONS[:2]]
  if name != "pallas" or None in fields:
    raise SystemExit(f"unknown variant {spec!r}: xla or pallas[:<gathers>][:<option>...] with "
                     f"options {', '.join(OPTIONS)}; kernels {', '.join(KERNELS)}")
  from sonic_jax.pallas import configs as cfg_lib
  from sonic_jax.pallas.backend import PallasKernels
  try:
    kern = PallasKernels(backward_gathers=gathers, dw1_last="dw1-early" not in opts,
                         row_gather=row_gather)
  except ValueError as e:
    raise SystemExit(f"variant {spec!r}: {e}") from None
  if not fields and "dh-ring" not in opts and not pingpong:
    return kern
  if d is None or n is None:
    raise SystemExit(f"variant {spec!r} needs the config's d and n")
  configs = _base_configs(kern, d, n)
  changed: dict[str, dict] = {}
  if pingpong:
    try:
      configs.update(_pingpong_configs(pingpong, d, n))
    except ValueError as e:
      raise SystemExit(f"variant {spec!r}: {e}") from None
    changed.update({k: {} for k in pingpong})
  if "dh-ring" in opts:
    if configs["dh"].gather != "xla":
      raise SystemExit(f"variant {spec!r}: dh-ring takes XLA's gathered dO, but dh gathers with "
                       f"{configs['dh'].gather!r} at d={d}, n={n}")
    changed["dh"] = dict(ring=True, max_concurrent_steps=3)
  for kernel, field, value in fields:
    if field not in {f.name for f in dataclasses.fields(configs[kernel])}:
      raise SystemExit(f"unknown variant {spec!r}: {type(configs[kernel]).__name__} has no "
                       f"field {field!r}")
    changed.setdefault(kernel, {})[field] = value
  try:
    config = cfg_lib.ForwardConfig(**{k: dataclasses.replace(configs[k], **v)
                                      for k, v in changed.items()})
  except (ValueError, TypeError) as e:
    raise SystemExit(f"variant {spec!r}: {e}") from None
  return PallasKernels(backward_gathers=gathers, dw1_last=kern.dw1_last, config=config,
                       row_gather=row_gather)


def _as_kernels(spec: str, d: int | None, n: int | None):
  kern = kernels_for(spec, d, n)
  if isinstance(kern, str):
    from sonic_jax.backends import resolve_backend
    kern = resolve_backend(kern, d=d, n=n)
  return kern


def _mixed_kernels(spec: str, d: int | None, n: int | None):
  """'pallas+dx_pairs/dw1=ffi' -> MixedKernels(PallasKernels(), dx_pairs=ffi, dw1=ffi)."""
  from sonic_jax.mixed import ENTRY_POINTS, MixedKernels
  base_spec, *parts = spec.split("+")
  overrides = {}
  for part in parts:
    entries, sep, sub = part.partition("=")
    names = entries.split("/")
    if not sep or not sub or not all(e in ENTRY_POINTS for e in names):
      raise SystemExit(f"variant {spec!r}: each '+' part is <entry>[/<entry>...]=<spec> with "
                       f"entries from {', '.join(ENTRY_POINTS)}, got {part!r}")
    kern = _as_kernels(sub, d, n)
    overrides.update({e: kern for e in names})
  try:
    return MixedKernels(_as_kernels(base_spec, d, n), **overrides)
  except ValueError as e:
    raise SystemExit(f"variant {spec!r}: {e}") from None


ROUTE_PATHS = ("saved-logits", "two-step", "recomputed-router", "raw-probs")


def layer_for(spec: str, d: int, n: int, top_k: int):
  """'<backend spec>[@<route path>]' -> layer(x, router_w, w1, w2) -> (T, d).

  Without a route path: ``sonic_jax.moe`` (top-K routing and the experts as one custom_vjp).
  The route paths are what ``moe`` ran before: ``saved-logits`` (``route_logits`` on the router's
  logits, which autodiff keeps for the backward), ``two-step`` (``route`` then ``moe_experts``:
  XLA adds the router's x-gradient after the experts' dx combine) and ``recomputed-router``
  (that, the scores renormalized outside ``router_top_k`` so that its backward recomputes the
  router GEMM and the (T, E) softmax, as before session 26). ``raw-probs`` is ``moe`` with
  ``renormalize=False`` (OLMoE / Qwen3 style): its backward recomputes the router GEMM once.
  """

  import sonic_jax
  from sonic_jax import routing
  from sonic_jax.triton import resolve_route_impl

  # '@' also joins a kind to its schedule in an ffi spec ('ffi:schedule=KIND@CONFIG'), so only
  # a last '@' part naming a route path is one.
  kern_spec, sep, path = spec.rpartition("@")
  if path not in ROUTE_PATHS:
    if sep and not re.search(r"schedule=[^:@]+@[^:@]+$", spec):
      raise SystemExit(f"variant {spec!r}: route paths are {ROUTE_PATHS}")
    kern_spec, path = spec, ""
  kern = kernels_for(kern_spec, d, n)
  if path in ("", "raw-probs"):
    renormalize = path != "raw-probs"
    return lambda x, rw, w1, w2: sonic_jax.moe(x, rw, w1, w2, top_k=top_k, backend=kern,
                                               renormalize=renormalize)

  def layer(x, rw, w1, w2):
    impl = resolve_route_impl("auto")
    if path == "saved-logits":
      plan = routing.route_logits(routing.router_logits(x, rw), top_k=top_k, impl=impl)
    elif path == "recomputed-router":
      top_p, top_e = routing.router_top_k(x, rw, top_k, impl=impl)
      plan = routing.plan_from_top_k(top_p, top_e, rw.shape[1], True, impl)
    else:
      plan = routing.route(x, rw, top_k=top_k, impl=impl)
    return sonic_jax.moe_experts(x, plan, w1, w2, backend=kern)

  return layer
