"""What the benchmark runs: sonic_jax backends, baselines and the dense ceiling.

Every implementation answers ``skip_reason(cfg, spec)`` (None when it can run) and
``prepare(problem, spec) -> (layer, args)``; the runner jits ``jax.vjp`` of ``layer`` for the
forward (training forward: residuals materialized) and forward+backward. The PyTorch SonicMoE
baseline is timed by ``torch_baseline.measure`` instead.

Baselines:
* ``mgpu-grouped``: a plain grouped-GEMM MoE (XLA gather of x rows, jax's
  ``ragged_dot_mgpu`` for both projections, SwiGLU and combine in XLA; backward through
  ``ragged_dot_mgpu(transpose_rhs=True)`` and ``transposed_ragged_dot_mgpu``). It keeps what a
  plain autodiff MoE keeps (gathered x, H, A, Y), so it is also the memory baseline.
* ``tokamax``: the same MoE with ``tokamax.ragged_dot(implementation="mosaic")`` (its own vjp).
* ``lax-ragged``: the same MoE with ``jax.lax.ragged_dot`` (XLA densifies it on GPUs: only
  where the E× temporary fits, see ``dense_ref_bytes``).
* ``dense-ceiling``: a dense SwiGLU MLP of the same total shape, (T·K, d) rows through one
  (d, 2n) and one (n, d) matrix: the GEMM work of the layer with no routing, what a grouped
  GEMM is held to.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import jax
import jax.numpy as jnp

from sonic_jax.bench.configs import BenchConfig
from sonic_jax.bench.problems import Layer, Problem, RoutingSpec, plan_fn, sonic_layer
from sonic_jax.bench.timing import on_gpu

_F32 = jnp.float32


def dense_ref_bytes(cfg: BenchConfig, spec: RoutingSpec) -> int:
  """Bytes of the zero-padded [E, T·K, max(d, 2n)] bf16 temporary XLA's GPU ragged_dot makes."""
  pairs = cfg.T * cfg.K
  if spec.method == "tr":
    pairs = spec.routing.capacity(cfg.T, cfg.E, cfg.K)
  return cfg.E * pairs * max(cfg.d, 2 * cfg.n) * 2


def densify_skip_reason(cfg: BenchConfig, spec: RoutingSpec, opts) -> str | None:
  """Why a lax.ragged_dot-based implementation is skipped on a GPU at this size, or None."""
  if not on_gpu():
    return None
  need = dense_ref_bytes(cfg, spec)
  if need > opts.dense_ref_budget_gib * 2**30:
    return (f"skipped: XLA densifies ragged_dot on GPUs ({need / 2**30:.0f} GiB temporary, "
            f"over --dense-ref-budget-gib {opts.dense_ref_budget_gib:g})")
  return None


@dataclasses.dataclass
class Impl:
  """A benchmarked implementation. kind: 'backend', 'baseline' or 'ceiling'."""

  name: str
  kind: str
  checkable: bool = True       # compared with the xla backend at a small size
  counts_routed_pairs: bool = True  # TFLOP/s from the kept pairs (else from T·K)

  def skip_reason(self, cfg: BenchConfig, spec: RoutingSpec, opts) -> str | None:
    return None

  def prepare(self, problem: Problem, spec: RoutingSpec) -> tuple[Layer, tuple]:
    raise NotImplementedError


# ------------------------------------------------------------------ sonic_jax backends


@dataclasses.dataclass
class SonicBackend(Impl):
  """A sonic_jax backend; ``spec`` is 'xla', 'pallas', 'ffi', a backends.COMBINED name
  ('pallas+ffi', 'pallas+ffi-wgrad') or 'pallas-interpret'."""

  spec_name: str = "xla"
  _kernels: object = None
  _error: str | None = None

  def kernels(self):
    if self._kernels is None and self._error is None:
      try:
        if self.spec_name == "pallas-interpret":
          from sonic_jax.pallas.backend import PallasKernels
          self._kernels = PallasKernels(interpret=True)
        else:
          from sonic_jax.backends import resolve_backend
          self._kernels = resolve_backend(self.spec_name)
      except Exception as e:  # noqa: BLE001 - reported, never fatal
        self._error = f"{type(e).__name__}: {e}"
    return self._kernels

  def skip_reason(self, cfg, spec, opts):
    if self.kernels() is None:
      return f"unavailable: {self._error}"
    if self.spec_name == "xla":
      return densify_skip_reason(cfg, spec, opts)
    return None

  def prepare(self, problem, spec):
    return sonic_layer(self.kernels(), problem.cfg, spec), problem.args


# ------------------------------------------------------------------ plain grouped-GEMM MoE


def _swiglu(h: jax.Array) -> jax.Array:
  n = h.shape[-1] // 2
  hf = h.astype(_F32)
  return (jax.nn.silu(hf[..., :n]) * hf[..., n:]).astype(h.dtype)


def plain_moe_layer(cfg: BenchConfig, spec: RoutingSpec,
                    rdot: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> Layer:
  """A plain MoE on a grouped GEMM ``rdot(lhs (P, k), rhs (E, k, m), group_sizes) -> (P, m)``.

  Gathers x rows in XLA, keeps gathered x, H, A and Y for autodiff. With token rounding the rows
  past the kept pairs are masked so a kernel's unwritten padding never leaks into results.
  """
  make_plan = plan_fn(cfg, spec)

  def layer(x, router_w, w1, w2):
    plan = make_plan(x, router_w)
    gs = plan.group_sizes
    mask = None if plan.top_k is not None else plan.valid_mask()[:, None]
    keep = (lambda a: a) if mask is None else (lambda a: jnp.where(mask, a, 0))
    xg = keep(x[plan.gather_idx])
    h = keep(rdot(xg, w1, gs))
    y = keep(rdot(_swiglu(h), w2, gs))
    rows = y[plan.reverse_idx].astype(_F32) * plan.scores[:, None]  # flat order
    if plan.top_k is not None:
      out = rows.reshape(cfg.T, cfg.K, cfg.d).sum(axis=1)
    else:
      out = jax.ops.segment_sum(keep(rows), plan.token_ids, num_segments=cfg.T,
                                indices_are_sorted=True)
    return out.astype(x.dtype)

  return layer


def _largest_divisor(n: int, choices=(8, 4, 2, 1)) -> int:
  return next(c for c in choices if n % c == 0)


def mgpu_ragged_dot() -> Callable:
  """``ragged_dot`` with a custom_vjp over jax's Mosaic GPU grouped-GEMM kernels.

  Tiles are the best measured on an H200 (reference notes §1.6): forward 128×128×64, 5 stages,
  grid_block_n up to 8; weight gradient 128×128×64, 4 stages.
  """
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd_mod
  from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as trd_mod

  def _rd(lhs, rhs, gs, transpose_rhs=False):
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    block_n = 128 if n % 128 == 0 else 64
    return rd_mod.ragged_dot(
        lhs, rhs, group_sizes=gs, block_m=128, block_n=block_n, block_k=64,
        max_concurrent_steps=5, grid_block_n=_largest_divisor(-(-n // block_n)),
        transpose_rhs=transpose_rhs)

  def _trd(lhs, rhs, gs):  # Σ_{p in e} lhs[p]ᵀ rhs[p] -> (E, m, n)
    m, n = lhs.shape[1], rhs.shape[1]
    return trd_mod.transposed_ragged_dot(
        lhs, rhs, group_sizes=gs, block_m=128 if m % 128 == 0 else 64,
        block_n=128 if n % 128 == 0 else 64, block_k=64, max_concurrent_steps=4,
        grid_block_n=1)

  @jax.custom_vjp
  def rdot(lhs, rhs, gs):
    return _rd(lhs, rhs, gs)

  def fwd(lhs, rhs, gs):
    return _rd(lhs, rhs, gs), (lhs, rhs, gs)

  def bwd(res, g):
    lhs, rhs, gs = res
    g = g.astype(lhs.dtype)
    return _rd(g, rhs, gs, transpose_rhs=True), _trd(lhs, g, gs).astype(rhs.dtype), None

  rdot.defvjp(fwd, bwd)
  return rdot


def _tokamax_rdot() -> Callable:
  tokamax = importlib.import_module("tokamax")

  def rdot(lhs, rhs, gs):
    return tokamax.ragged_dot(lhs, rhs, gs, implementation="mosaic")

  return rdot


def _lax_rdot(lhs, rhs, gs):
  return jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=_F32).astype(lhs.dtype)


@dataclasses.dataclass
class PlainMoE(Impl):
  gemm: str = "mgpu"  # mgpu | tokamax | lax

  def skip_reason(self, cfg, spec, opts):
    if self.gemm == "mgpu":
      if not on_gpu():
        return "unavailable: jax's Mosaic GPU ragged_dot kernels need a GPU"
      if cfg.d % 64 or cfg.n % 64:
        return "skipped: ragged_dot_mgpu needs d and n multiples of 64"
    elif self.gemm == "tokamax":
      try:
        importlib.import_module("tokamax")
      except Exception as e:  # noqa: BLE001
        return f"unavailable: tokamax does not import ({type(e).__name__}: {str(e)[:80]})"
      if not on_gpu():
        return "unavailable: tokamax's mosaic ragged_dot needs a GPU"
    elif self.gemm == "lax":
      return densify_skip_reason(cfg, spec, opts)
    return None

  def prepare(self, problem, spec):
    rdot = {"mgpu": mgpu_ragged_dot, "tokamax": _tokamax_rdot, "lax": lambda: _lax_rdot}[
        self.gemm]()
    return plain_moe_layer(problem.cfg, spec, rdot), problem.args


# ------------------------------------------------------------------ dense ceiling


@dataclasses.dataclass
class DenseCeiling(Impl):
  """swiglu(X W1) W2 on X (T·K, d): the same GEMM shapes with no routing, gather or combine."""

  def prepare(self, problem, spec):
    cfg = problem.cfg
    rows = cfg.T * cfg.K
    key = jax.random.key(1)
    xr = jax.jit(lambda: (0.2 * jax.random.normal(key, (rows, cfg.d), _F32)).astype(
        problem.x.dtype))()

    def layer(xr, w1, w2):
      # Plain operand-dtype dots (cuBLAS accumulates in fp32 inside). With
      # preferred_element_type=f32 + astype, autodiff feeds fp32 cotangents to the backward
      # dots and they run as fp32 GEMMs (tests/test_bench.py checks the backward's dtypes).
      h = jnp.dot(xr, w1)
      n = h.shape[-1] // 2
      a = jax.nn.silu(h[:, :n]) * h[:, n:]
      return jnp.dot(a, w2)

    return layer, (xr, problem.w1[0], problem.w2[0])


# ------------------------------------------------------------------ registry

BASELINES = ("mgpu-grouped", "tokamax", "lax-ragged", "sonicmoe-torch", "dense-ceiling")


def make_impl(name: str) -> Impl:
  """'xla' | 'pallas' | 'ffi' | a backends.COMBINED name | 'pallas-interpret' | one of
  BASELINES."""
  from sonic_jax.backends import NAMES
  if name in NAMES or name == "pallas-interpret":
    return SonicBackend(name, "backend", spec_name=name)
  if name == "mgpu-grouped":
    return PlainMoE(name, "baseline", gemm="mgpu")
  if name == "tokamax":
    return PlainMoE(name, "baseline", gemm="tokamax")
  if name == "lax-ragged":
    return PlainMoE(name, "baseline", gemm="lax")
  if name == "dense-ceiling":
    return DenseCeiling(name, "ceiling", checkable=False, counts_routed_pairs=False)
  if name == "sonicmoe-torch":
    from sonic_jax.bench.torch_baseline import TorchSonicMoE
    return TorchSonicMoE(name, "baseline", checkable=False)
  raise ValueError(
      f"implementation {name!r} is not one of {', '.join(NAMES)}, pallas-interpret, "
      f"{', '.join(BASELINES)}")
