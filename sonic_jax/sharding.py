"""Running the MoE layer on a device mesh: data parallel, FSDP and expert parallel.

Kernel calls (Pallas Mosaic GPU, CUTLASS FFI) are opaque to XLA's SPMD partitioner, so the layer
is partitioned by hand with ``jax.shard_map``: every device routes its own tokens and calls the
single-device expert block (``sonic_jax.moe_experts``, a ``jax.custom_vjp``) on local shapes.

Mesh axes (any subset, named by ``MoESharding``):

* ``data_axis`` (one name or a tuple): splits the tokens. Weights are replicated over it; their
  gradients are summed over it (shard_map's transpose psums the cotangent of an input over the
  axes its spec does not name).
* ``fsdp_axis``: splits the tokens *and* the ``embed`` (d) dimension of every weight. Weights
  are all-gathered per layer inside the shard_map; autodiff turns that into a reduce-scatter of
  the weight gradients (ZeRO-3 style).
* ``expert_axis``: splits the tokens *and* the experts. Each device routes its tokens over all E
  experts, sends each (token, expert) pair to the device that owns the expert with an
  ``all_to_all`` of a fixed-capacity buffer, runs its E/X local experts on what it received,
  and sends the score-weighted results back, where they are summed per token.

The shard_map runs with ``check_vma=False``: Pallas / FFI kernel outputs are declared with plain
ShapeDtypeStructs (no varying-axes type), which ``check_vma=True`` rejects.

Tokens are split over all named axes together, in the order (data..., fsdp, expert): the token
spec is ``P((data..., fsdp, expert), None)``. Mesh axes not named are replicated over (each
device along them repeats the same work), so a tensor-parallel axis used elsewhere in a model
is harmless.

Expert-parallel exchange and capacity: at most C rows go from one device to another. With
``exchange="dense"`` (the default) they travel as a dense ``all_to_all`` of a (X, C, d) buffer,
padding included. With ``exchange="ragged"`` only the valid rows travel, through
``jax.lax.ragged_all_to_all`` (sizes and offsets exchanged first with an ``all_gather`` of the
per-device counts), packed densely on the receiver and returned straight into the sender's
grouped order; results are identical to the dense exchange. XLA:CPU does not implement
ragged-all-to-all in jax 0.11.2 (``UNIMPLEMENTED: HLO opcode ragged-all-to-all``), so on CPU
meshes "ragged" runs an equivalent dense emulation (for tests). The default
``capacity_factor=None`` is dropless: C = the most pairs one device can send to another
(``T_local * min(K, E/X)`` for top-K). A ``capacity_factor`` f sets
C = min(dropless, round_up(ceil(f * T_local * K / X), 8)); pairs that do not fit are dropped
(they contribute nothing to their token's output and receive no gradient; the token's other
experts keep their scores). ``expert_parallel_capacity`` computes C.

Token rounding (``routing="token_rounding"``) runs per shard: each device rounds its own
per-expert counts, so the result equals ``sonic_jax.moe`` applied to each token shard
separately (not to all tokens at once).

Backends: the backend name is passed unchanged to ``moe_experts`` on every device, so "pallas"
and "ffi" run their kernels on local shapes on GPUs; "xla" runs everywhere (CPU tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sonic_jax.backends import validate_backend_name
from sonic_jax.experts import moe_experts, moe_top_k
from sonic_jax.kernels import ExpertKernels
from sonic_jax.nn import MoE
from sonic_jax.routing import (RoutingPlan, TokenRounding, balance_loss, route,
                               validate_router_args, validate_routing_args)
from sonic_jax.triton import validate_route_impl  # imports without jax-triton
from sonic_jax.xla_backend import XlaKernels


def _axes_tuple(axis) -> tuple[str, ...]:
  if axis is None:
    return ()
  if isinstance(axis, str):
    return (axis,)
  return tuple(axis)


@dataclasses.dataclass(frozen=True)
class MoESharding:
  """How the MoE layer maps onto a mesh (static, hashable).

  Attributes:
    mesh: a ``jax.sharding.Mesh`` (Auto or Explicit axis types).
    data_axis: mesh axis name (or tuple of names) splitting tokens only; None for none.
    fsdp_axis: mesh axis splitting tokens and the weights' embed (d) dimension; None for none.
    expert_axis: mesh axis splitting tokens and experts (expert parallel); None for none.
    capacity_factor: expert-parallel buffer size (see module docstring); None = dropless.
    exchange: how expert parallelism moves rows: "dense" (``all_to_all`` of the whole
      (X, C, d) buffer) or "ragged" (``ragged_all_to_all`` of the valid rows only; see the
      module docstring).

  Partition specs of the global arrays (what ``sharded_moe`` expects and returns):
    x, out (T, d): ``token_spec`` = P((data..., fsdp, expert), None)
    router (d, E): ``router_spec`` = P(fsdp, expert)
    w1 (E, d, 2n): ``w1_spec`` = P(expert, fsdp, None)
    w2 (E, n, d): ``w2_spec`` = P(expert, None, fsdp)
  These are the logical axes of ``sonic_jax.nn`` (router ("embed", "expert"), w1 ("expert",
  "embed", "mlp"), w2 ("expert", "mlp", "embed")) under ``logical_axis_rules``:
  embed -> fsdp, expert -> expert, mlp -> replicated.
  """

  mesh: Mesh
  data_axis: str | tuple[str, ...] | None = "data"
  fsdp_axis: str | None = None
  expert_axis: str | None = None
  capacity_factor: float | None = None
  exchange: Literal["dense", "ragged"] = "dense"

  def __post_init__(self):
    if not isinstance(self.mesh, Mesh):
      raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(self.mesh).__name__}")
    object.__setattr__(self, "data_axis", _axes_tuple(self.data_axis) or None)
    for field in ("fsdp_axis", "expert_axis"):
      v = getattr(self, field)
      if v is not None and not isinstance(v, str):
        raise ValueError(f"{field} must be a mesh axis name (str) or None, got {v!r}")
    names = self.token_axes
    if not names:
      raise ValueError("MoESharding needs at least one of data_axis, fsdp_axis, expert_axis")
    for name in names:
      if name not in self.mesh.axis_names:
        raise ValueError(
            f"unknown mesh axis {name!r}: the mesh has axes {tuple(self.mesh.axis_names)}")
    if len(set(names)) != len(names):
      raise ValueError(
          f"data_axis, fsdp_axis and expert_axis must name distinct mesh axes, got {names}")
    if self.exchange not in ("dense", "ragged"):
      raise ValueError(f"exchange must be 'dense' or 'ragged', got {self.exchange!r}")
    cf = self.capacity_factor
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                           or not cf > 0):
      raise ValueError(f"capacity_factor must be a positive number or None, got {cf!r}")

  # -- axes and sizes ---------------------------------------------------------------------

  @property
  def token_axes(self) -> tuple[str, ...]:
    """Mesh axes splitting the token dimension, in order (data..., fsdp, expert)."""
    return (_axes_tuple(self.data_axis) + _axes_tuple(self.fsdp_axis)
            + _axes_tuple(self.expert_axis))

  def axis_size(self, axis: str | None) -> int:
    return 1 if axis is None else int(self.mesh.shape[axis])

  @property
  def num_token_shards(self) -> int:
    return int(np.prod([self.mesh.shape[a] for a in self.token_axes]))

  @property
  def num_expert_shards(self) -> int:
    return self.axis_size(self.expert_axis)

  @property
  def num_fsdp_shards(self) -> int:
    return self.axis_size(self.fsdp_axis)

  # -- partition specs --------------------------------------------------------------------

  @property
  def token_spec(self) -> P:
    return P(self.token_axes, None)

  @property
  def router_spec(self) -> P:
    return P(self.fsdp_axis, self.expert_axis)

  @property
  def w1_spec(self) -> P:
    return P(self.expert_axis, self.fsdp_axis, None)

  @property
  def w2_spec(self) -> P:
    return P(self.expert_axis, None, self.fsdp_axis)

  @property
  def logical_axis_rules(self) -> tuple[tuple[str, str | None], ...]:
    """Rules mapping ``sonic_jax.nn`` logical axis names to this mesh's axes."""
    return (("embed", self.fsdp_axis), ("expert", self.expert_axis), ("mlp", None))

  def param_specs(self) -> dict[str, P]:
    """PartitionSpecs keyed like the ``sonic_jax.nn.MoE`` parameters."""
    return {"router": self.router_spec, "w1": self.w1_spec, "w2": self.w2_spec}

  def param_shardings(self) -> dict[str, NamedSharding]:
    return {k: NamedSharding(self.mesh, s) for k, s in self.param_specs().items()}

  @property
  def token_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, self.token_spec)

  # -- validation and capacity ------------------------------------------------------------

  def validate(self, num_tokens: int, d_model: int, num_experts: int) -> None:
    """Raises ValueError when the mesh axis sizes do not divide T, d or E."""
    nt = self.num_token_shards
    if num_tokens % nt:
      raise ValueError(
          f"the number of tokens T = {num_tokens} (x.shape[0]) must be divisible by the number "
          f"of token shards {nt} = product of mesh axes {self._sizes(self.token_axes)}")
    ne = self.num_expert_shards
    if num_experts % ne:
      raise ValueError(
          f"the number of experts E = {num_experts} must be divisible by the size {ne} of "
          f"expert_axis {self.expert_axis!r}")
    nf = self.num_fsdp_shards
    if d_model % nf:
      raise ValueError(
          f"d_model = {d_model} must be divisible by the size {nf} of fsdp_axis "
          f"{self.fsdp_axis!r} (FSDP splits the weights' embed dimension)")

  def _sizes(self, axes) -> dict[str, int]:
    return {a: int(self.mesh.shape[a]) for a in axes}


def expert_parallel_capacity(local_tokens: int, num_experts: int, top_k: int, num_shards: int,
                             *, routing: str | TokenRounding = "topk",
                             capacity_factor: float | None = None) -> int:
  """Rows C that one device can send to one other device in the expert-parallel exchange.

  Dropless bound: a token sends at most min(K, E/X) pairs to one device (top-K), or, with token
  rounding, at most min(plan capacity, T_local·E/X) pairs go to one device. With
  ``capacity_factor`` f: C = min(dropless, round_up(ceil(f·T_local·K/X), 8)).
  """
  local_experts = num_experts // num_shards
  rounding = validate_routing_args(np.zeros((1, num_experts), np.float32), top_k, routing)
  if rounding is None:
    dropless = local_tokens * min(top_k, local_experts)
  else:
    dropless = min(rounding.capacity(local_tokens, num_experts, top_k),
                   local_tokens * local_experts)
  if capacity_factor is None:
    return dropless
  c = math.ceil(capacity_factor * local_tokens * top_k / num_shards)
  return max(1, min(dropless, -(-c // 8) * 8))


def _explicit(mesh: Mesh) -> bool:
  return any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def sharded_moe(x: jax.Array, router_w: jax.Array, w1: jax.Array, w2: jax.Array, *,
                sharding: MoESharding, top_k: int, renormalize: bool = True,
                routing: str | TokenRounding = "topk",
                backend: str | ExpertKernels = "auto", routing_impl: str = "auto",
                return_aux_loss: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
  """``sonic_jax.moe`` on a device mesh (data parallel, FSDP and/or expert parallel).

  Args:
    x: (T, d) tokens, global shape. Laid out as ``sharding.token_spec`` (resharded if not).
    router_w: (d, E), ``sharding.router_spec``.
    w1: (E, d, 2n) gate | up, ``sharding.w1_spec``; w2: (E, n, d), ``sharding.w2_spec``.
    sharding: the ``MoESharding`` (mesh and axis roles).
    top_k, renormalize, routing, backend, routing_impl: as ``sonic_jax.moe``; routing runs per
      token shard.
    return_aux_loss: also return the load-balancing loss of all T tokens (fp32 scalar,
      replicated), equal to ``load_balancing_loss`` on the global logits and group sizes.
  Returns:
    out (T, d) in x.dtype with spec ``sharding.token_spec`` [, aux loss].
  """
  if not isinstance(sharding, MoESharding):
    raise ValueError(f"sharding must be a sonic_jax.sharding.MoESharding, got "
                     f"{type(sharding).__name__}")
  validate_router_args(x, router_w)
  validate_backend_name(backend)
  validate_route_impl(routing_impl, "routing_impl")
  t, d = x.shape
  e = router_w.shape[1]
  for name, arr in (("w1", w1), ("w2", w2)):
    if getattr(arr, "ndim", None) != 3 or arr.shape[0] != e:
      raise ValueError(f"{name} must have shape (E={e}, ., .) with E = router_w.shape[1], got "
                       f"{jnp.shape(arr)}")
  if w1.shape[1] != d or w1.shape[2] % 2 or w2.shape[1:] != (w1.shape[2] // 2, d):
    raise ValueError(f"w1 must have shape (E, d={d}, 2n) and w2 (E, n, d={d}), got w1 "
                     f"{w1.shape}, w2 {w2.shape}")
  validate_routing_args(np.zeros((1, e), np.float32), top_k, routing)
  sharding.validate(t, d, e)

  cfg = sharding
  specs = (cfg.token_spec, cfg.router_spec, cfg.w1_spec, cfg.w2_spec)
  if _explicit(cfg.mesh):
    # Explicit-axis meshes: shard_map insists that inputs already carry its in_specs.
    x, router_w, w1, w2 = (jax.sharding.reshard(a, NamedSharding(cfg.mesh, s))
                           for a, s in zip((x, router_w, w1, w2), specs))
  local_tokens = t // cfg.num_token_shards
  capacity = None
  if cfg.expert_axis is not None:
    capacity = expert_parallel_capacity(local_tokens, e, top_k, cfg.num_expert_shards,
                                        routing=routing, capacity_factor=cfg.capacity_factor)

  def body(x, router_w, w1, w2):
    if cfg.fsdp_axis is not None:
      router_w = jax.lax.all_gather(router_w, cfg.fsdp_axis, axis=0, tiled=True)
      w1 = jax.lax.all_gather(w1, cfg.fsdp_axis, axis=1, tiled=True)
      w2 = jax.lax.all_gather(w2, cfg.fsdp_axis, axis=2, tiled=True)
    if cfg.expert_axis is not None:
      router_w = jax.lax.all_gather(router_w, cfg.expert_axis, axis=1, tiled=True)
    if cfg.expert_axis is None and routing == "topk":
      # One custom_vjp for the router's and the experts' backward (as sonic_jax.moe).
      out, plan, mean_p = moe_top_k(x, router_w, w1, w2, top_k=top_k, renormalize=renormalize,
                                    return_mean_probs=return_aux_loss, backend=backend,
                                    routing_impl=routing_impl)
    else:
      routed = route(x, router_w, top_k=top_k, renormalize=renormalize, routing=routing,
                     impl=routing_impl, return_mean_probs=return_aux_loss)
      plan, mean_p = routed if return_aux_loss else (routed, None)
      if cfg.expert_axis is None:
        out = moe_experts(x, plan, w1, w2, backend=backend)
      else:
        ep = (functools.partial(_expert_parallel_ragged,
                                native=_native_ragged_all_to_all(cfg.mesh))
              if cfg.exchange == "ragged" else _expert_parallel)
        out = ep(x, plan, w1, w2, axis=cfg.expert_axis, num_shards=cfg.num_expert_shards,
                 capacity=capacity, backend=backend)
    if not return_aux_loss:
      return out
    return out, balance_loss(jax.lax.pmean(mean_p, cfg.token_axes),
                             jax.lax.psum(plan.group_sizes.astype(jnp.float32), cfg.token_axes))

  out_specs = (cfg.token_spec, P()) if return_aux_loss else cfg.token_spec
  # check_vma=False: kernel outputs (pallas_call / ffi_call results declared with plain
  # ShapeDtypeStructs) carry no varying-axes type, which check_vma=True rejects. Without it,
  # the transpose sums the cotangents of inputs over the mesh axes their specs do not name:
  # the weight gradients are psum-ed over the token axes (all_gather -> psum_scatter for FSDP).
  fn = jax.shard_map(body, mesh=cfg.mesh, in_specs=specs, out_specs=out_specs, check_vma=False)
  return fn(x, router_w, w1, w2)


def expert_parallel_dropped(x: jax.Array, router_w: jax.Array, *, sharding: MoESharding,
                            top_k: int, renormalize: bool = True,
                            routing: str | TokenRounding = "topk",
                            routing_impl: str = "auto") -> jax.Array:
  """Number of (token, expert) pairs ``sharded_moe`` would drop for these inputs (int32 scalar).

  Routes like ``sharded_moe`` (per token shard) and counts, over all devices, the pairs that do
  not fit the expert-parallel capacity C (see ``expert_parallel_capacity``). Always 0 without an
  expert axis or with the dropless default. For choosing ``capacity_factor``. routing_impl: as
  ``sharded_moe`` (every choice makes the same plan).
  """
  validate_router_args(x, router_w)
  t, d = x.shape
  e = router_w.shape[1]
  validate_routing_args(np.zeros((1, e), np.float32), top_k, routing)
  validate_route_impl(routing_impl, "routing_impl")
  sharding.validate(t, d, e)
  cfg = sharding
  if cfg.expert_axis is None:
    return jnp.zeros((), jnp.int32)
  x_size = cfg.num_expert_shards
  cap = expert_parallel_capacity(t // cfg.num_token_shards, e, top_k, x_size, routing=routing,
                                 capacity_factor=cfg.capacity_factor)
  if _explicit(cfg.mesh):
    x, router_w = (jax.sharding.reshard(a, NamedSharding(cfg.mesh, s))
                   for a, s in ((x, cfg.token_spec), (router_w, cfg.router_spec)))

  def body(x, router_w):
    if cfg.fsdp_axis is not None:
      router_w = jax.lax.all_gather(router_w, cfg.fsdp_axis, axis=0, tiled=True)
    router_w = jax.lax.all_gather(router_w, cfg.expert_axis, axis=1, tiled=True)
    plan = route(x, router_w, top_k=top_k, renormalize=renormalize, routing=routing,
                 impl=routing_impl)
    bounds = plan.group_offsets[::e // x_size]
    dropped = jnp.sum(jnp.maximum(bounds[1:] - bounds[:-1] - cap, 0), dtype=jnp.int32)
    return jax.lax.psum(dropped, cfg.token_axes)

  return jax.shard_map(body, mesh=cfg.mesh, in_specs=(cfg.token_spec, cfg.router_spec),
                       out_specs=P(), check_vma=False)(x, router_w)


def _expert_parallel(x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array, *,
                     axis: str, num_shards: int, capacity: int, backend) -> jax.Array:
  """Per-device expert-parallel block (inside shard_map).

  x (T_l, d) local tokens; plan routes them over all E experts; w1 (E/X, d, 2n), w2 (E/X, n, d)
  are this device's experts (device s owns experts [s·E/X, (s+1)·E/X)). Returns (T_l, d).
  """
  num_experts = plan.num_experts
  local_experts = num_experts // num_shards
  c = capacity
  # In grouped order, pairs are sorted by expert, hence by owning device: device s receives
  # grouped rows [group_offsets[s·E/X], group_offsets[(s+1)·E/X]); the first C of them fit.
  bounds = plan.group_offsets[::local_experts]  # (X+1,)
  starts, counts = bounds[:-1], bounds[1:] - bounds[:-1]
  slot = jnp.arange(c, dtype=jnp.int32)
  send_valid = slot[None, :] < counts[:, None]  # (X, C)
  p = jnp.where(send_valid, starts[:, None] + slot[None, :], 0)
  j = plan.scatter_idx[p]  # flat pair of each slot
  send_tok = plan.gather_idx[p]
  dest = jnp.arange(num_shards, dtype=jnp.int32)[:, None]
  send_exp = jnp.where(send_valid, plan.expert_ids[j] - dest * local_experts, -1)
  send_score = jnp.where(send_valid, plan.scores[j], 0.0)
  send_x = jnp.where(send_valid[..., None], x[send_tok], 0).astype(x.dtype)

  # (X, C, ...) -> (X, C, ...): block s goes to device s; block s of the result came from s.
  a2a = lambda a: jax.lax.all_to_all(a, axis, 0, 0)  # noqa: E731
  recv_x, recv_exp, recv_score = a2a(send_x), a2a(send_exp), a2a(send_score)

  # Each received row is a "token" with at most one pair (its local expert). Valid rows first,
  # ascending, as RoutingPlan.from_assignments requires.
  rows = num_shards * c
  recv_exp = recv_exp.reshape(rows)
  recv_valid = recv_exp >= 0
  order = jnp.argsort(~recv_valid, stable=True).astype(jnp.int32)
  n_valid = jnp.sum(recv_valid, dtype=jnp.int32)
  local_plan = RoutingPlan.from_assignments(
      order, recv_exp[order], recv_score.reshape(rows)[order], num_tokens=rows,
      num_experts=local_experts, valid=jnp.arange(rows, dtype=jnp.int32) < n_valid)
  y = moe_experts(recv_x.reshape(rows, -1), local_plan, w1, w2, backend=backend)  # s·Y per row

  back = a2a(y.reshape(num_shards, c, -1))  # (X, C, d): result for my slot (s, c)
  back = jnp.where(send_valid[..., None], back.astype(jnp.float32), 0.0)
  out = jnp.zeros((x.shape[0], x.shape[1]), jnp.float32).at[send_tok.reshape(-1)].add(
      back.reshape(rows, -1))
  return out.astype(x.dtype)


def _native_ragged_all_to_all(mesh: Mesh) -> bool:
  """Whether XLA on the mesh's platform implements ragged-all-to-all (XLA:CPU does not)."""
  return mesh.devices.flat[0].platform != "cpu"


def _ragged_all_to_all(operand: jax.Array, output: jax.Array, input_offsets: jax.Array,
                       send_sizes: jax.Array, output_offsets: jax.Array, recv_sizes: jax.Array,
                       *, axis: str, max_size: int, native: bool) -> jax.Array:
  """``jax.lax.ragged_all_to_all`` with one slice per device (offsets/sizes have shape (X,)).

  With ``native=False`` (for XLA:CPU, which lacks the collective) the same result is computed
  from a dense ``all_to_all`` of an (X, max_size, ...) staging buffer: every slice holds at most
  ``max_size`` rows. Both are linear in (operand, output), so autodiff works either way.
  """
  if native:
    return jax.lax.ragged_all_to_all(operand, output, input_offsets, send_sizes,
                                     output_offsets, recv_sizes, axis_name=axis)
  i = jnp.arange(max_size, dtype=jnp.int32)
  src = input_offsets[:, None] + i[None, :]  # (X, S)
  ok = (i[None, :] < send_sizes[:, None]).reshape(*src.shape, *(1,) * (operand.ndim - 1))
  block = jnp.where(ok, operand[jnp.clip(src, 0, operand.shape[0] - 1)], 0).astype(operand.dtype)
  recv = jax.lax.all_to_all(block, axis, 0, 0)  # block s came from device s
  # Where each sender asked its slice to land in my output.
  dst_off = jax.lax.all_to_all(output_offsets, axis, 0, 0, tiled=True)
  dst = jnp.where(i[None, :] < recv_sizes[:, None], dst_off[:, None] + i[None, :],
                  output.shape[0])  # out of range: dropped by the scatter
  return output.at[dst.reshape(-1)].set(recv.reshape(-1, *operand.shape[1:]), mode="drop")


def _expert_parallel_ragged(x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array, *,
                            axis: str, num_shards: int, capacity: int, backend,
                            native: bool = True) -> jax.Array:
  """``_expert_parallel`` with ``ragged_all_to_all``: only valid rows cross the network.

  Same pairs and drop rule as the dense exchange (at most C rows per (sender, receiver)), so
  the results are identical. Rows are packed densely on the receiver, sender by sender, and
  return straight into the sender's grouped order, where the per-token sum reads them.
  """
  local_experts = plan.num_experts // num_shards
  c = capacity
  bounds = plan.group_offsets[::local_experts]  # (X+1,): grouped rows bound for each device
  starts = bounds[:-1]
  counts = jnp.minimum(bounds[1:] - bounds[:-1], c)  # rows I send to each device
  me = jax.lax.axis_index(axis)
  all_counts = jax.lax.all_gather(counts, axis)  # (sender, receiver)
  all_starts = jax.lax.all_gather(starts, axis)
  packed = jnp.cumsum(all_counts, axis=0) - all_counts  # sender's offset in receiver's buffer
  recv_sizes = all_counts[:, me]
  recv_offsets = packed[:, me]
  rows = num_shards * c

  flat = plan.scatter_idx  # grouped row p -> flat pair j
  send_x = x[plan.gather_idx]  # (P, d) in grouped order; only the sent runs are read
  send_exp = plan.expert_ids[flat] % local_experts
  send_score = plan.scores[flat]
  exchange = lambda a: _ragged_all_to_all(  # noqa: E731
      a, jnp.zeros((rows, *a.shape[1:]), a.dtype), starts, counts, packed[me], recv_sizes,
      axis=axis, max_size=c, native=native)
  recv_x, recv_exp, recv_score = exchange(send_x), exchange(send_exp), exchange(send_score)
  n_valid = jnp.sum(recv_sizes, dtype=jnp.int32)
  row = jnp.arange(rows, dtype=jnp.int32)
  local_plan = RoutingPlan.from_assignments(row, recv_exp, recv_score, num_tokens=rows,
                                            num_experts=local_experts, valid=row < n_valid)
  y = moe_experts(recv_x, local_plan, w1, w2, backend=backend)  # s·Y per received row
  # Back to the senders, into the grouped rows they came from (dropped rows stay zero).
  back = _ragged_all_to_all(y, jnp.zeros((send_x.shape[0], y.shape[1]), y.dtype), recv_offsets,
                            recv_sizes, all_starts[:, me], counts, axis=axis, max_size=c,
                            native=native)
  # The unweighted combine (scores were applied on the receiver) sums each token's rows.
  return XlaKernels().combine(back, plan, None, x.dtype)


def shard_moe_layers(model: nnx.Module, sharding: MoESharding | None) -> int:
  """Sets ``sharding`` on every ``sonic_jax.nn.MoE`` inside ``model`` (in place).

  Each layer then runs through ``sharded_moe`` on the mesh (None switches back to the local
  layer). Returns the number of layers changed.
  """
  if sharding is not None and not isinstance(sharding, MoESharding):
    raise ValueError(f"sharding must be None or a MoESharding, got {type(sharding).__name__}")
  layers = [node for _, node in nnx.iter_graph(model) if isinstance(node, MoE)]
  for layer in layers:
    layer.sharding = sharding
  return len(layers)


def place_params(model: nnx.Module, sharding: MoESharding) -> None:
  """Puts the parameters of every ``nn.MoE`` inside ``model`` on the mesh with
  the specs of ``sharding.param_specs()`` and replicates all other parameters, in place."""
  replicated = NamedSharding(sharding.mesh, P())
  nnx.update(model, jax.tree.map(lambda v: jax.device_put(v, replicated),
                                 nnx.state(model, nnx.Param)))
  for _, node in nnx.iter_graph(model):
    if isinstance(node, MoE):
      for name, spec in sharding.param_specs().items():
        var = getattr(node, name)
        var.set_value(jax.device_put(var.get_value(), NamedSharding(sharding.mesh, spec)))


__all__ = ["MoESharding", "expert_parallel_capacity",
           "expert_parallel_dropped", "place_params", "shard_moe_layers", "sharded_moe"]
