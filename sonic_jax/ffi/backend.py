"""FfiKernels: the kernel contract on CUTLASS grouped GEMMs and CUDA kernels (XLA FFI).

Composition (each step one FFI call, all device-side, no host sync, CUDA-graph capturable):
  up_proj   gather x rows -> varlen-M GEMM writing bf16 H -> SwiGLU kernel (A from bf16 H)
  down_proj varlen-M GEMM A·W2 (bf16 out)
  dh        gather dO rows -> varlen-M GEMM dO·W2ᵀ (fp32) -> dSwiGLU/dS/A' kernel
  dw2, dw1  gather rows -> varlen-K GEMM (fp32 out; empty experts give zeros)
  dx_pairs  varlen-M GEMM dH·W1ᵀ (bf16 out)
  combine   one kernel, 16-byte loads, fp32 accumulation (weighted or not)
A comes from the bf16-rounded H, as the backward recomputes it (session 1 wrote an fp32
accumulator and read it back: 2x the bytes). Tile schedules per shape: sonic_jax.ffi.schedules.
``fused_gather`` lets up_proj and dh, ``wgrad_gather`` dw1 and dw2, read the x / dO rows through
gather_idx inside the GEMM (cp.async producer, GitHub issue #5) instead of from a gathered (P, d)
copy; by default ("auto") dh and dw2 do so where dout_in_gemm(d, n) and up_proj and dw1 where
x_in_gemm(n) (small n), where it makes the step faster (no copy of dO or x at all), and the
rows are scattered elsewhere (docs/ffi.md). ``fused_epilogue`` runs
up_proj and / or dh as one kernel each with SwiGLU / dSwiGLU in the GEMM's epilogue (the cp.async
GEMM of csrc/gather_gemm.cuh, reading the x / dO rows through gather_idx itself: H and A from the
accumulators; dH, A' and dS from dA' without its fp32 round trip through HBM; opt-in, slower on the
H200 so far); elsewhere the epilogues are separate kernels. The gathered rows come from
``scatter_rows`` for top-K plans (``row_gather="scatter"``, the default: each token row read once
and written to its K grouped rows; H200, session 12: 0.661 against 1.026 ms for ``gather_rows`` at
T=32768, d=4096, K=8, benchmarks/results/dispatch-h200-2026-12-04-s12.md) and from ``gather_rows``
otherwise (token rounding, or ``row_gather="gather"``).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from sonic_jax.ffi import ops, schedules as schedules_mod
from sonic_jax.ffi.ops import GemmKind
from sonic_jax.kernels import ExpertKernels
from sonic_jax.routing import RoutingPlan

_INT32_MAX = 2**31 - 1

FUSED_EPILOGUES = ("none", "dh", "up_proj", "both")
# Which entry points read their rows through gather_idx inside the GEMM: fused_gather (up_proj
# reads x, dh reads dO) and wgrad_gather (dw1 reads x, dw2 reads dO). Taking dh and dw2 alone
# ("dh" / "dw2") removes the scatter of dO; up_proj and dw1 the scatter of x.
# "auto" (the default of both): the dO path (dh, dw2) in the GEMM where dout_in_gemm(d, n), the
# x path (up_proj, dw1) where x_in_gemm(n); elsewhere the rows are scattered.
FUSED_GATHERS = ("auto", "none", "up_proj", "dh", "both")
WGRAD_GATHERS = ("auto", "none", "dw1", "dw2", "both")
# up_proj's SwiGLU without the in-GEMM gather: "separate" (the GEMM writes H, then
# swiglu_from_h), "gemm" (config 14's TMA GEMM over the gathered copy of x writes H and A from
# its epilogue; that copy is dW1's too) or "gemm_pingpong" (the same GEMM ping-pong, config 17:
# each tile's epilogue under the other consumer warpgroup's mainloop).
UP_PROJ_EPILOGUE_CONFIGS = {"gemm": ops.GemmConfig.TMA_AB_128x256_C1,
                            "gemm_pingpong": ops.GemmConfig.TMA_AB_PINGPONG_64x256_C1}
UP_PROJ_EPILOGUES = ("separate", *UP_PROJ_EPILOGUE_CONFIGS)


def dout_in_gemm(d: int, n: int) -> bool:
  """Whether the "auto" default has dh and dW2 read dO through gather_idx (no scatter of dO)
  for model width d and expert width n: where that made the layer step faster in session 22's
  same-call kernel profiles (benchmarks/results/ffi-s22-h100-2026-12-05.md), n <= 256, or
  n <= 512 at d <= 1024. At n = 256 dW2's 256-row tile covers n, so each gathered dO row is read
  once (CUTLASS's 128 x 256 varlen-K GEMM reads the scattered rows twice). Faster (ms): H200
  1.4B-n256 3.371 vs 3.446, 7B-n256 3.648 vs 3.738, 30B-n256 22.89 vs 23.42, 1.4B-n512 2.909
  vs 2.950; H100 1.4B-n256 3.814 vs 4.004, 7B-n256 4.074 vs 4.266. Slower: H200 7B-n512 3.141 vs
  3.120, 30B-n512 20.09 vs 20.01; H100 120B-n512 42.58 vs 41.26, 120B-n1024 37.18 vs 36.32.
  """
  return n <= 256 or (n <= 512 and d <= 1024)


def x_in_gemm(n: int) -> bool:
  """Whether the "auto" default has up_proj and dW1 read x through gather_idx (no scatter of x,
  so no (P, d) copy of x in the step) for expert width n: where that made the step faster or no
  slower in session 34's same-call kernel profiles (H100, dO path in the GEMM in both;
  benchmarks/results/s34-h100-2026-12-07.md), n <= 256 at every measured d. ms, defaults of then
  against x in the GEMM: 7B-n256 3.956 vs 3.889, 1.4B-n256 3.742 vs 3.683, 30B-n256 24.006 vs
  23.956 (and 4 GiB less: no (T·K, d) copy of x); slower at n = 512: 1.4B-n512 3.149 vs 3.173,
  30B-n512 19.81 vs 20.29, 120B-n512 40.77 vs 41.58 (7B-n512 3.348 vs 3.332). The scatter it
  removes costs more than what the gather adds to up_proj's GEMM (0.509 -> 0.568 ms at
  7B-n256) and to dW1's (0.490 -> 0.613).
  """
  return n <= 256


def _which(arg: str, value: bool | str, choices: tuple[str, ...]) -> str:
  """A per-entry switch (fused_epilogue, fused_gather, wgrad_gather) as one of ``choices``
  ("none", entry names, "both", maybe "auto"); True is "both" and False "none"."""
  if isinstance(value, bool):
    return "both" if value else "none"
  if value not in choices:
    raise ValueError(f"{arg} must be a bool or one of {choices}, got {value!r}")
  return value
# Schedule of the kernels that gather rows inside the GEMM (fused_gather, fused_epilogue):
# "tma_b" (the default, GATHER_TMA_B_128x256_C2x1: weights by TMA multicast over a 2 x 1 cluster,
# stages published by noinc mbarrier arrivals), "cp_async" (GATHER_COOP_128x256: weights by
# cp.async, stages published after the producer's own wait; the default until session 18) or
# "noinc" (GATHER_NOINC_128x256: cp.async weights, noinc publication); "pingpong" and
# "pingpong_c1" (session 32; correct, slower on the H100): 64 x 256 tiles, one per consumer
# warpgroup, each one's epilogue under the other's mainloop, weights by TMA over a 2 x 1
# cluster or without one.
GATHER_SCHEDULE_CONFIGS: dict[str, ops.GemmConfig] = {
    "tma_b": ops.GemmConfig.GATHER_TMA_B_128x256_C2x1,
    "cp_async": ops.GemmConfig.GATHER_COOP_128x256,
    "noinc": ops.GemmConfig.GATHER_NOINC_128x256,
    "tma_b_c1": ops.GemmConfig.GATHER_TMA_B_128x256_C1,
    "pingpong": ops.GemmConfig.GATHER_PINGPONG_64x256_C2x1,
    "pingpong_c1": ops.GemmConfig.GATHER_PINGPONG_64x256_C1,
}
# "auto" (the default): each entry point's fastest, H100, session 30 (benchmarks/results/
# s30-h100-2026-12-07.md, in isolation): dh's gathered GEMM without the cluster (tma_b_c1: 3.422
# against 3.780 ms at 120B-n1024, 0.355 against 0.370 at 7B-n256), up_proj's with it (tma_b:
# 7.300 against 7.591, 0.634 against 0.626).
GATHER_SCHEDULE_AUTO = {"up_proj": "tma_b", "dh": "tma_b_c1"}
GATHER_SCHEDULES = ("auto", *GATHER_SCHEDULE_CONFIGS)


# Where the dx combine takes the router's x-gradient (combine_add): "kernel" (the CUDA combine
# starting from it: 0.249 ms against the combine's 0.224 plus the add's 0.069 at 7B-n256, the
# step 1.2-1.3 % shorter at 7B-n256 and 1.4B-n512; H100, benchmarks/results/
# s27-h100-2026-12-06.md) or "xla" (an add kernel after the combine).
COMBINE_ADD_DEFAULT = "kernel"

# The kinds FfiKernels(schedules=...) can set: the plain grouped GEMMs the backend runs (up_proj
# and down_proj, dh, dx_pairs, dW1 / dW2 on gathered copies).
PLAIN_KINDS = (GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_M_NT_BF16,
               GemmKind.VARLEN_K_BF16)


def _schedule_overrides(value) -> tuple[tuple[GemmKind, ops.GemmConfig], ...]:
  """FfiKernels' ``schedules`` as a sorted tuple of (kind, config); ValueError naming the kind
  or config that is not a plain kind or not instantiated for it."""
  if value is None:
    return ()
  if not isinstance(value, Mapping):
    raise ValueError(f"schedules must be a mapping {{kind: config}}, got {value!r}")
  out = {}
  for kind, config in value.items():
    try:
      kind = GemmKind[kind] if isinstance(kind, str) else GemmKind(kind)
      config = ops.GemmConfig[config] if isinstance(config, str) else ops.GemmConfig(config)
    except (KeyError, ValueError):
      raise ValueError(f"schedules: unknown kind or config in {kind!r}: {config!r}") from None
    if kind not in PLAIN_KINDS:
      raise ValueError(f"schedules: kind must be one of {[k.name for k in PLAIN_KINDS]}, got "
                       f"{kind.name}")
    schedules_mod.check(kind, config)
    out[kind] = config
  return tuple(sorted(out.items()))


class FfiKernels(ExpertKernels):
  """CUTLASS/CUDA kernels through the XLA FFI (bf16, Hopper sm_90a).

  fused_gather: up_proj and dh read their x / dO rows through gather_idx inside the GEMM: a
  bool, or one of FUSED_GATHERS ("up_proj" or "dh" alone; "auto", the default: dh where
  dout_in_gemm(d, n) and up_proj where x_in_gemm(n), with wgrad_gather "auto" making dW2 /
  dW1 do the same, so that dO / x is never scattered there).
  fused_epilogue: which entry points compute SwiGLU / dSwiGLU in the GEMM's epilogue (one
  kernel each: the cp.async GEMM, rows gathered in the kernel) instead of a TMA GEMM followed by
  an elementwise kernel: "none" (or False, the default), "dh", "up_proj" or "both" (or True).
  Opt-in: the cp.async GEMM without cluster multicast is slower than CUTLASS's TMA GEMM by more
  than the elementwise pass costs (H200, session 16, docs/ffi.md).
  dswiglu: the separate dSwiGLU kernel, "warp" (a warp per row, the default) or "block" (a
  256-thread block per row, which leaves 3/4 of its threads idle at n = 256). H200, session 20,
  in the layer step: 0.513 vs 1.304 ms at 30B-n256, 0.317 vs 0.831 at 1.4B-n256, 0.938 vs 1.078
  at 120B-n1024 (the 1.4B-n256 step 3.42 vs 3.94 ms).
  gather_schedule: the schedule of the kernels that gather rows inside the GEMM (``fused_gather``,
  ``fused_epilogue``), one of GATHER_SCHEDULES: "auto" (the default since session 30,
  GATHER_SCHEDULE_AUTO: tma_b_c1 for dh, tma_b for up_proj; the step at 7B-n256 / 1.4B-n256
  3.945 / 3.736 ms against tma_b's 3.959 / 3.751 on the H100), "tma_b" (the producer never waits
  for its own copies, and the weights come by TMA multicast over a 2 x 1 cluster, half the
  weight bytes from L2 per CTA), "cp_async" (the session-6 kernel), "noinc" (cp.async weights,
  noinc publication), "tma_b_c1" (tma_b without the cluster: each CTA loads its whole weight
  tile; session 28; H100, session 30: dh 3.42 against tma_b's 3.78 ms at 120B-n1024, up_proj
  7.59 against 7.30) or "pingpong" / "pingpong_c1" (session 32, slower on the H100 in
  session 33: 64 x 256 tiles, one per consumer warpgroup, whose epilogues run under each
  other's mainloops, for the fused epilogues; weights by TMA with or without the 2 x 1
  cluster). H200, 120B-n1024, isolated: up_proj 6.93 / 9.19 / 10.80 ms and dh 3.53 / 4.53 /
  4.56 ms for tma_b / cp_async /
  noinc (gather_rows + TMA GEMM 7.04 and 4.09); the layer with fused_gather 36.13 / 39.64 /
  41.42 ms (docs/ffi.md, session 18).
  wgrad_gather: dW1 and dW2 read their x / dO rows through gather_idx inside the varlen-K GEMM
  (``ops.gathered_varlen_k``: the gathered rows by cp.async, dH / A' by TMA multicast over a
  2-CTA cluster) instead of from scatter_rows' (P, d) copy: a bool, or one of WGRAD_GATHERS
  ("dw1" or "dw2" alone; "auto", the default: dw2 where dout_in_gemm(d, n), dw1 where
  x_in_gemm(n) and up_proj_epilogue is "separate"). With ``fused_gather`` no (P, d) copy of
  x or dO is made in a training step; ``fused_gather="dh", wgrad_gather="dw2"`` makes none of
  dO. dW1 in the GEMM is slower than CUTLASS's varlen-K GEMM over the scattered copy (H100,
  session 34: 0.613 against 0.490 ms at 7B-n256); it pays where the scatter it saves costs
  more, with up_proj also in the GEMM (x_in_gemm).
  up_proj_epilogue: one of UP_PROJ_EPILOGUES: "separate" (the default: CUTLASS's GEMM writes H,
  then ``swiglu_from_h`` reads it back for A) or "gemm" (one kernel, config 14
  ``TMA_AB_128x256_C1`` with the SwiGLU epilogue, over the same gathered copy of x that dW1
  reads: unlike ``fused_epilogue="up_proj"`` it leaves dW1 its copy). Not with a
  ``fused_epilogue`` or ``fused_gather`` that names up_proj. Opt-in: that kernel took 3.565 /
  0.652 / 7.556 ms at 30B-n512 / 7B-n256 / 120B-n1024 against 3.290 / 0.598 / 7.002 for the
  two it replaces (H100, session 31, benchmarks/results/s31-h100-2026-12-07.md).
  "gemm_pingpong" (session 32) is the same GEMM ping-pong (config 17): each 64 x 256 tile's
  epilogue runs under the other consumer warpgroup's mainloop (0.906 against 0.605 ms at
  7B-n256, H100, session 33).
  row_gather: "scatter" (default) or "gather": what makes the gathered rows of top-K plans.
  dw1_last: order the backward for peak memory (``ExpertKernels.dw1_last``): dW1 re-gathers x
  after dW2 and dx instead of sharing the forward's gathered x (XLA's CSE would keep that (P, d)
  copy alive from the forward to dW1: 4 GiB at T=32768, d=4096, K=16). Off by default: on the
  H200 it took the step from 10.54 to 6.54 GiB at that shape for 5.3 % more time (1.7 % at n =
  1024, K = 8; docs/ffi.md). Moot where dW1 reads x through gather_idx (``wgrad_gather``, by
  default where x_in_gemm(n)): then no copy of x exists.
  combine_add: how the dx combine takes the router's x-gradient (``moe_top_k``): "kernel" (the
  CUDA combine's fp32 sum starts from it: no add kernel) or "xla" (the combine, then XLA's add);
  the default is COMBINE_ADD_DEFAULT.
  schedules: tile schedules for the plain grouped GEMM kinds, {kind: config} (GemmKind /
  GemmConfig or their names, e.g. ``{"VARLEN_M_NN_BF16": "COOPERATIVE_128x256_C2x1"}``), used
  instead of ``schedules.pick``'s for every shape; to compare schedules inside the step.
  """

  name = "ffi"

  def __init__(self, fused_gather: bool | str = "auto", row_gather: str = "scatter",
               dw1_last: bool = False, fused_epilogue: bool | str = "none",
               dswiglu: str = "warp", gather_schedule: str = "auto",
               wgrad_gather: bool | str = "auto", combine_add: str = COMBINE_ADD_DEFAULT,
               schedules: Mapping[GemmKind | str, ops.GemmConfig | str] | None = None,
               up_proj_epilogue: str = "separate"):
    fused_epilogue = _which("fused_epilogue", fused_epilogue, FUSED_EPILOGUES)
    if up_proj_epilogue not in UP_PROJ_EPILOGUES:
      raise ValueError(f"up_proj_epilogue must be one of {UP_PROJ_EPILOGUES}, got "
                       f"{up_proj_epilogue!r}")
    if gather_schedule not in GATHER_SCHEDULES:
      raise ValueError(f"gather_schedule must be one of {GATHER_SCHEDULES}, got "
                       f"{gather_schedule!r}")
    if dswiglu not in ("block", "warp"):
      raise ValueError(f"dswiglu must be 'block' or 'warp', got {dswiglu!r}")
    if not isinstance(dw1_last, bool):
      raise ValueError(f"dw1_last must be a bool, got {dw1_last!r}")
    fused_gather = _which("fused_gather", fused_gather, FUSED_GATHERS)
    wgrad_gather = _which("wgrad_gather", wgrad_gather, WGRAD_GATHERS)
    if row_gather not in ("gather", "scatter"):
      raise ValueError(f"row_gather must be 'gather' or 'scatter', got {row_gather!r}")
    if combine_add not in ("kernel", "xla"):
      raise ValueError(f"combine_add must be 'kernel' or 'xla', got {combine_add!r}")
    if up_proj_epilogue != "separate" and (fused_epilogue in ("up_proj", "both")
                                           or fused_gather in ("up_proj", "both")):
      raise ValueError(f"up_proj_epilogue={up_proj_epilogue!r} reads the gathered copy of x: "
                       "fused_epilogue and fused_gather must not name up_proj (got "
                       f"fused_epilogue={fused_epilogue!r}, fused_gather={fused_gather!r})")
    self.fused_gather = fused_gather
    self.row_gather = row_gather
    self.dw1_last = dw1_last
    self.fused_epilogue = fused_epilogue
    self.dswiglu = dswiglu
    self.gather_schedule = gather_schedule
    self.wgrad_gather = wgrad_gather
    self.combine_add_impl = combine_add
    self.schedules = _schedule_overrides(schedules)
    self.up_proj_epilogue = up_proj_epilogue

  def _key(self):
    return (self.fused_gather, self.row_gather, self.dw1_last, self.fused_epilogue,
            self.dswiglu, self.gather_schedule, self.wgrad_gather, self.combine_add_impl,
            self.schedules, self.up_proj_epilogue)

  # Value semantics: the custom_vjp expert block is cached per backend instance
  # (experts._expert_block), so equal configurations share one trace.
  def __hash__(self):
    return hash((type(self), self._key()))

  def __eq__(self, other):
    return type(other) is type(self) and other._key() == self._key()

  def __repr__(self):
    return (f"FfiKernels(fused_gather={self.fused_gather!r}, row_gather={self.row_gather!r}, "
            f"dw1_last={self.dw1_last}, fused_epilogue={self.fused_epilogue!r}, "
            f"dswiglu={self.dswiglu!r}, gather_schedule={self.gather_schedule!r}, "
            f"wgrad_gather={self.wgrad_gather!r}, combine_add={self.combine_add_impl!r}, "
            f"up_proj_epilogue={self.up_proj_epilogue!r}"
            + (f", schedules={ {k.name: c.name for k, c in self.schedules} }"
               if self.schedules else "") + ")")

  def _schedule(self, kind: GemmKind) -> ops.GemmConfig | None:
    """The ``schedules`` override for ``kind``; None: ``schedules.pick`` chooses."""
    return dict(self.schedules).get(kind)

  def _rows(self, src, plan):
    """src[plan.gather_idx] (P, d): scatter_rows for top-K plans with row_gather="scatter",
    else gather_rows."""
    if self.row_gather == "scatter" and plan.fixed_top_k is not None:
      return ops.scatter_rows(src, plan.reverse_idx)
    return ops.gather_rows(src, plan.gather_idx, plan.group_offsets)

  def validate(self, x: jax.Array, plan: RoutingPlan, w1: jax.Array, w2: jax.Array) -> None:
    """Raises ValueError for dtypes or sizes the kernels cannot handle (before any kernel runs)."""
    for arg, arr in (("x", x), ("w1", w1), ("w2", w2)):
      if arr.dtype != jnp.bfloat16:
        raise ValueError(f"backend='ffi' needs bf16 operands: {arg} has dtype {arr.dtype}")
    d, two_n = w1.shape[1], w1.shape[2]
    n = two_n // 2
    # TMA needs 16-byte aligned row starts and strides: 8 bf16 elements.
    if d % 8:
      raise ValueError(f"backend='ffi' needs d (x.shape[1]) to be a multiple of 8, got {d}")
    if n % 8:
      raise ValueError(f"backend='ffi' needs n (w2.shape[1]) to be a multiple of 8, got {n}")
    if not 1 <= plan.capacity <= _INT32_MAX:
      raise ValueError(f"backend='ffi' needs 1 <= plan capacity <= 2**31 - 1 (int32 group "
                       f"offsets), got {plan.capacity}")

  def _names(self, switch: str, entry: str, d: int, n: int) -> bool:
    """Whether a fused_gather / wgrad_gather value puts ``entry`` in the GEMM (model width d,
    expert width n). "auto" leaves x scattered when up_proj_epilogue runs over the gathered
    copy of x: dW1 then reads that copy."""
    if switch == "auto":
      if entry in ("dh", "dw2"):
        return dout_in_gemm(d, n)
      return self.up_proj_epilogue == "separate" and x_in_gemm(n)
    return switch in ("both", entry)

  def _gathered_gemm(self, entry, src, w, plan, kind, fused_kind, n):
    """src[gather_idx] · w[e] per group: in one GEMM reading src's rows through gather_idx
    (``fused_kind``) where ``fused_gather`` names ``entry``, else the gathered rows (scatter_rows
    or gather_rows) then the ``kind`` GEMM."""
    offs = plan.group_offsets
    if self._names(self.fused_gather, entry, src.shape[1], n):
      return ops.gathered_grouped_gemm(src, plan.gather_idx, w, offs, fused_kind,
                                       config=self._gather_config(entry))
    return ops.grouped_gemm(self._rows(src, plan), w, offs, kind, config=self._schedule(kind))

  def _gather_config(self, entry: str) -> ops.GemmConfig:
    """Config of ``entry``'s ("up_proj" or "dh") in-GEMM gather kernel."""
    sched = self.gather_schedule
    return GATHER_SCHEDULE_CONFIGS[GATHER_SCHEDULE_AUTO[entry] if sched == "auto" else sched]

  def _fuses(self, entry: str) -> bool:
    """Whether ``entry`` ("up_proj" or "dh") runs the fused-epilogue kernel."""
    return self.fused_epilogue in ("both", entry)

  def up_proj(self, x, w1, plan, *, inference=False):
    # The fused kernels read x / dO through gather_idx: faster than on scatter_rows' gathered
    # copy in all four measured cases (H200, session 16; docs/ffi.md).
    if self._fuses("up_proj"):
      return ops.up_proj_swiglu(x, plan.gather_idx, w1, plan.group_offsets,
                                write_h=not inference, config=self._gather_config("up_proj"))
    if self.up_proj_epilogue != "separate":
      return ops.up_proj_swiglu(self._rows(x, plan), None, w1, plan.group_offsets,
                                write_h=not inference,
                                config=UP_PROJ_EPILOGUE_CONFIGS[self.up_proj_epilogue])
    h = self._gathered_gemm("up_proj", x, w1, plan, GemmKind.VARLEN_M_NN_BF16,
                            GemmKind.VARLEN_M_GATHER_NN_BF16, w1.shape[2] // 2)
    a = ops.swiglu_from_h(h, plan.group_offsets)
    return (None if inference else h), a

  def down_proj(self, a, w2, plan):
    kind = GemmKind.VARLEN_M_NN_BF16
    return ops.grouped_gemm(a, w2, plan.group_offsets, kind, config=self._schedule(kind))

  def combine(self, y, plan, scores, out_dtype):
    out = ops.combine(y, plan.token_offsets, plan.reverse_idx, scores, plan.num_tokens)
    return out.astype(out_dtype)

  def combine_add(self, y, plan, addend, out_dtype):
    # "kernel": the addend is the CUDA combine's starting value, no add kernel after it (bf16
    # output only); "xla": the combine, then XLA's add.
    if self.combine_add_impl == "xla" or jnp.dtype(out_dtype) != jnp.bfloat16:
      return super().combine_add(y, plan, addend, out_dtype)
    return ops.combine_add(y, plan.token_offsets, plan.reverse_idx, addend)

  def dh(self, dout, w2, h, scores_grouped, plan):
    if self._fuses("dh"):
      return ops.dh_dswiglu(dout, plan.gather_idx, w2, h, scores_grouped, plan.group_offsets,
                            config=self._gather_config("dh"))
    da = self._gathered_gemm("dh", dout, w2, plan, GemmKind.VARLEN_M_NT_F32,
                             GemmKind.VARLEN_M_GATHER_NT_F32, w2.shape[1])
    return ops.dswiglu(da, h, scores_grouped, plan.group_offsets,
                       warp_per_row=self.dswiglu == "warp")

  def dw2(self, dout, a_prime, plan):
    offs = plan.group_offsets
    if self._names(self.wgrad_gather, "dw2", dout.shape[1], a_prime.shape[1]):
      return ops.gathered_varlen_k(a_prime, None, dout, plan.gather_idx, offs)
    dog = self._rows(dout, plan)
    kind = GemmKind.VARLEN_K_BF16
    return ops.grouped_gemm(a_prime, dog, offs, kind, config=self._schedule(kind))

  def dx_pairs(self, dh, w1, plan):
    kind = GemmKind.VARLEN_M_NT_BF16
    return ops.grouped_gemm(dh, w1, plan.group_offsets, kind, config=self._schedule(kind))

  def dw1(self, x, dh, plan):
    offs = plan.group_offsets
    if self._names(self.wgrad_gather, "dw1", x.shape[1], dh.shape[1] // 2):
      return ops.gathered_varlen_k(x, plan.gather_idx, dh, None, offs)
    xg = self._rows(x, plan)
    kind = GemmKind.VARLEN_K_BF16
    return ops.grouped_gemm(xg, dh, offs, kind, config=self._schedule(kind))
