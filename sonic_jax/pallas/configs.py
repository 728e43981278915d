"""Static tiling configs for the Pallas forward kernels, a per-shape heuristic table, autotune cache.

Heuristic table (bf16, H200; see docs/pallas-forward.md for the measurements behind it):

| GEMM | condition | block_m x block_n x block_k | stages | warpgroups | tile width |
| --- | --- | --- | --- | --- | --- |
| plain (down_proj, dx_pairs) | N % 256 == 0, k >= 4096 | 128 x 256 x 32, rows split (64 x 256 per consumer), across-tiles ring | 6 | 2 consumers + 1 TMA | 16 |
| dx_pairs (transposed W1) | N % 256 == 0, k >= 2048, k % 64 == 0 | 128 x 256 x 64, rows split, across-tiles ring | 3 | 2 consumers + 1 TMA | 8 |
| plain | N % 256 == 0, k % 64 == 0 | 128 x 128 x 64 (CTA 128 x 256), across-tiles ring | 3 | 2 consumers + 1 TMA | 16 |
| plain | N % 256 == 0, otherwise | 128 x 128 x 32 (CTA 128 x 256), across-tiles ring | 6 | 2 consumers + 1 TMA | 16 |
| plain | N % 128 == 0 | 128 x 128 x 64 | 5 | 1 | 8 |
| plain | otherwise | 128 x 64 x 64 | 5 | 1 | 8 |
| SwiGLU (up_proj; gate+up = 2 accumulators), fused gather | n % 128 == 0 | 128 x 128 (x2) x 32, rows split (64 x 2·128 per consumer), swizzled epilogue | 6 | 2 consumers + 1 cp.async/TMA | 16 (8 at n >= 2048) |
| SwiGLU, XLA gather | n % 128 == 0 | 128 x 64 (x2) x 32, swizzled epilogue | 6 | 2 consumers + 1 TMA | 8 |
| SwiGLU | n % 64 == 0 | 128 x 64 (x2) x 64 | 4-5 | 1 | 8 |
| SwiGLU | otherwise | 128 x 32 (x2) x 64 | 4-5 | 1 | 8 |
| combine | default impl "xla" (measured 4x faster); impl "mosaic": largest block_d in {256, 192, ..., 8} dividing d | 64 tokens x block_d columns | 4-slot ring | 1 | - |

Stage counts keep one CTA's SMEM (ring + epilogue tiles) under 220 KiB. The plain ring rows
store full tiles through the swizzled epilogue where k <= 2048 (session 13). "Swizzled epilogue"
(``epilogue_swizzle``): full tiles are stored through a swizzled SMEM tile with one TMA. ``block_k`` (64 in the single-warpgroup rows) drops to 32 when the contraction dim is not a
multiple of 64. The across-tiles ring and row-split rows were picked by
``benchmarks/pallas_forward.py --down-sweep --fused-sweep`` on an H200 (2026-12-03, session 6) at
30B-256, 30B-512, 120B-2048 and DeepSeek-V3-like; the XLA-gather warp-specialized row by
``benchmarks/pallas_sweep.py`` (session 2, 30B-512); the single-warpgroup rows are session 1's. The rules only pick
among configs that tile the shape; ``backend.PallasKernels.validate`` rejects shapes none tiles.
``autotune`` (optional) times candidate configs on the current GPU and caches the winner as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Callable, Literal

if TYPE_CHECKING:  # dh.py / wgrad.py import the kernels; configs.py stays import-light
  from sonic_jax.pallas.dh import DhConfig
  from sonic_jax.pallas.wgrad import WgradConfig

GatherMode = Literal["xla", "fused"]


@dataclasses.dataclass(frozen=True)
class GemmConfig:
  """Tiling of one grouped GEMM.

  block_m: rows per M-tile (64 or 128: one wgmma M per warpgroup). block_n: columns per
  consumer warpgroup (per accumulator: SwiGLU keeps a gate and an up accumulator). block_k:
  contraction step (64 bf16 = one 128-byte swizzle row). max_concurrent_steps: pipeline stages.
  grid_tile_width: N-tiles per band of the planar-snake (L2-friendly) tile order.
  num_compute_wgs: 1 = one warpgroup issues TMA and wgmma (``emit_pipeline``); 2 = a TMA
  producer warpgroup feeds two consumer warpgroups splitting N (warp specialization).
  gather: where up_proj gathers x rows: "xla" (before the kernel) or "fused" (in the kernel).
  epilogue_swizzle: full tiles (all block_m rows in the group, the common case) go through a
  swizzled SMEM tile and one TMA store (bank-conflict-free register stores); ragged tiles keep
  the untiled power-of-two store ladder. Both views share one SMEM buffer (``plgpu.RefUnion``).
  num_sms: persistent CTAs (None: the device's SM count).
  cross_tile: (without a gather) run the kernel of the fused gather, with the A tile by TMA: a
  producer warpgroup looping over every (tile, k step) of its CTA into one ring, instead of
  ``emit_pipeline_warp_specialized`` restarted per tile, whose producer waits for the end of each
  tile before loading the next. The heuristic's choice for plain GEMMs with N % 256 == 0
  since session 6 (H200: down_proj 1.11-1.25x the restarted pipeline); implies the
  warp-specialized layout (num_compute_wgs consumers + 1 producer).
  wg_split: how two consumer warpgroups share the CTA tile. "n" (default): each owns block_n
  columns of all block_m rows (CTA tile block_m x 2·block_n). "m": each owns block_m / 2 rows
  of all block_n columns (CTA tile block_m x block_n), so each wgmma is m64 x block_n and the
  A tile is read once per warpgroup and accumulator instead of twice: with SwiGLU's two
  accumulators, 64 x 128 (x2) per warpgroup instead of 128 x 64 (x2) at the same register
  count (fused up_proj 1-5 % faster on the H200). Only on the ring kernels (gather="fused" or
  cross_tile) with 2 consumers, block_m 128. "pingpong" (session 32; correct on the H100 and
  15-50 % slower per kernel than "n", session 33): each warpgroup owns whole tiles of block_m
  rows x block_n columns and the two take the CTA's tiles in turn from the one ring, their
  mainloops ordered by a barrier, so one warpgroup's epilogue runs under the other's mainloop
  (CUTLASS's ping-pong; SonicMoE's dH kernel). Ring kernels with 2 consumers, no cluster; the
  contraction's k steps must be a multiple of 2 x max_concurrent_steps (validate_gemm).
  pingpong_ring: "shared" (the above; the interpreter, which forbids a waiter lagging a
  barrier by more than one phase, runs it as "split") or "split": a ring of
  max_concurrent_steps // 2 stages per consumer, no order barrier (session 14's dh form,
  which lost there: docs/pallas-backward.md).
  cluster_m: 1, or 2 for 2-CTA clusters on the ring kernels: the two CTAs of a cluster take
  neighbouring M tiles of one expert (``tiles.make_tiles(pair=True)``: each expert's tile count
  rounded up to even, the extra tile owning no rows) and the same N block, and each loads half
  of the shared weight tile by TMA multicast (``copy_gmem_to_smem(collective_axes="cluster")``),
  so each CTA reads half the weight bytes from L2; a ring slot is refilled only once the
  consumers of both CTAs released it (a ClusterBarrier). In the interpreter (which has no
  cluster barriers) each CTA of the cluster loads its whole weight tile and releases its own
  slots; the pair tiles and the cluster grid are the same. Session 17: not yet run on a GPU.
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_tile_width: int = 8
  num_compute_wgs: int = 1
  gather: GatherMode = "xla"
  epilogue_swizzle: bool = False
  num_sms: int | None = None
  cross_tile: bool = False
  wg_split: Literal["n", "m", "pingpong"] = "n"
  cluster_m: int = 1
  pingpong_ring: Literal["shared", "split"] = "shared"

  @property
  def ring(self) -> bool:
    """Whether the kernel is the ring one (a producer warpgroup looping over every (tile, k
    step) of its CTA): with the fused gather, or with cross_tile."""
    return self.gather == "fused" or self.cross_tile

  @property
  def block_n_cta(self) -> int:
    """Output columns of one CTA tile."""
    return self.block_n * (self.num_compute_wgs if self.wg_split == "n" else 1)

  @property
  def pingpong(self) -> bool:
    """Whether the two consumer warpgroups take whole tiles in turn (wg_split="pingpong")."""
    return self.wg_split == "pingpong"

  @property
  def block_m_wg(self) -> int:
    """Rows of one consumer warpgroup's accumulators."""
    return self.block_m // (self.num_compute_wgs if self.wg_split == "m" else 1)

  def __post_init__(self):
    if self.block_m not in (64, 128):
      raise ValueError(f"GemmConfig.block_m must be 64 or 128, got {self.block_m}")
    if self.block_n % 8 or not 8 <= self.block_n <= 256:
      raise ValueError(f"GemmConfig.block_n must be a multiple of 8 in [8, 256], got "
                       f"{self.block_n}")
    if self.block_k not in (16, 32, 64, 128):
      raise ValueError(f"GemmConfig.block_k must be one of 16, 32, 64, 128, got {self.block_k}")
    if self.max_concurrent_steps < 2:
      raise ValueError(f"GemmConfig.max_concurrent_steps must be >= 2, got "
                       f"{self.max_concurrent_steps}")
    if self.num_compute_wgs not in (1, 2):
      raise ValueError(f"GemmConfig.num_compute_wgs must be 1 or 2, got {self.num_compute_wgs}")
    if self.gather not in ("xla", "fused"):
      raise ValueError(f"GemmConfig.gather must be 'xla' or 'fused', got {self.gather!r}")
    if self.grid_tile_width < 1:
      raise ValueError(f"GemmConfig.grid_tile_width must be >= 1, got {self.grid_tile_width}")
    if self.wg_split not in ("n", "m", "pingpong"):
      raise ValueError(f"GemmConfig.wg_split must be 'n', 'm' or 'pingpong', got "
                       f"{self.wg_split!r}")
    if self.pingpong_ring not in ("shared", "split"):
      raise ValueError(f"GemmConfig.pingpong_ring must be 'shared' or 'split', got "
                       f"{self.pingpong_ring!r}")
    if (self.wg_split == "pingpong" and self.pingpong_ring == "split"
        and self.max_concurrent_steps < 4):
      raise ValueError("GemmConfig.pingpong_ring='split' needs max_concurrent_steps >= 4 (two "
                       "stages per consumer's ring: a stage is released one step late), got "
                       f"{self.max_concurrent_steps}")
    if self.wg_split == "pingpong" and not (
        self.num_compute_wgs == 2 and self.ring and self.cluster_m == 1):
      raise ValueError("GemmConfig.wg_split='pingpong' needs num_compute_wgs=2, the ring kernel "
                       "(gather='fused' or cross_tile=True) and cluster_m=1, got "
                       f"num_compute_wgs={self.num_compute_wgs}, gather={self.gather!r}, "
                       f"cross_tile={self.cross_tile}, cluster_m={self.cluster_m}")
    if self.wg_split == "m" and not (self.num_compute_wgs == 2 and self.block_m == 128
                                     and self.ring):
      raise ValueError("GemmConfig.wg_split='m' needs num_compute_wgs=2, block_m=128 and the "
                       "ring kernel (gather='fused' or cross_tile=True), got "
                       f"num_compute_wgs={self.num_compute_wgs}, block_m={self.block_m}, "
                       f"gather={self.gather!r}, cross_tile={self.cross_tile}")
    if self.cluster_m not in (1, 2):
      raise ValueError(f"GemmConfig.cluster_m must be 1 or 2, got {self.cluster_m}")
    if self.cluster_m == 2 and not (self.ring and self.num_compute_wgs == 2):
      raise ValueError("GemmConfig.cluster_m=2 needs the ring kernel (gather='fused' or "
                       "cross_tile=True) with num_compute_wgs=2, got "
                       f"gather={self.gather!r}, cross_tile={self.cross_tile}, "
                       f"num_compute_wgs={self.num_compute_wgs}")


@dataclasses.dataclass(frozen=True)
class CombineConfig:
  """impl: "xla" (XLA's fused gather + fp32 sum; the default: 4.5 TB/s on H200 against 1.1-1.3
  TB/s for the Mosaic kernel, see docs/pallas-forward.md) or "mosaic" (combine.py's kernel).
  Mosaic kernel tiling: block_t tokens (64: one warpgroup's WGMMA-layout rows) x block_d columns
  (<= 256: one TMA box row) per work item; slots: depth of the staging ring of gathered Y rows."""

  impl: Literal["xla", "mosaic"] = "xla"
  block_t: int = 64
  block_d: int = 256
  slots: int = 4
  num_sms: int | None = None
  cross_tile: bool = False

  def __post_init__(self):
    if self.impl not in ("xla", "mosaic"):
      raise ValueError(f"CombineConfig.impl must be 'xla' or 'mosaic', got {self.impl!r}")
    if self.block_t != 64:
      raise ValueError(f"CombineConfig.block_t must be 64, got {self.block_t}")
    if self.block_d % 8 or not 8 <= self.block_d <= 256:
      raise ValueError(f"CombineConfig.block_d must be a multiple of 8 in [8, 256], got "
                       f"{self.block_d}")
    if self.slots < 1:
      raise ValueError(f"CombineConfig.slots must be >= 1, got {self.slots}")


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
  """Configs of one layer's kernels (None: heuristic per shape). Despite the name (kept for
  compatibility) it also holds the backward's: dx_pairs, dh (``dh.DhConfig``) and dw1 / dw2
  (``wgrad.WgradConfig``), e.g. ``dh=dh_config_for(d, n, gather="fused")`` for the in-kernel dO
  gather."""

  up_proj: GemmConfig | None = None
  down_proj: GemmConfig | None = None
  dx_pairs: GemmConfig | None = None
  combine: CombineConfig | None = None
  dh: "DhConfig | None" = None
  dw1: "WgradConfig | None" = None
  dw2: "WgradConfig | None" = None


def _block_k(k: int) -> int:
  return 64 if k % 64 == 0 else 32


def plain_gemm_config(k: int, n: int, *, gather: GatherMode = "xla",
                      transpose_rhs: bool = False) -> GemmConfig:
  """Heuristic for a grouped GEMM (P, k) x (k, n) without epilogue: down_proj, or with
  ``transpose_rhs`` (rhs stored (E, n, k)) dx_pairs = dH · W1ᵀ."""
  bk = _block_k(k)
  if n % 256 == 0:
    # The across-tiles ring (cross_tile): its producer loads the next tile while the consumers
    # finish this one. H200, session 6 (pallas-forward-h200-2026-12-03-s6.md), against the
    # restarted pipeline (128 x 128 x 32, 6 stages): down_proj 1.846 / 2.071 ms at 30B-512,
    # 3.161 / 3.390 at 120B-2048, 7.059 / 8.498 at DeepSeek-V3-like (128 x 128 x 64, 3 stages).
    # With a short contraction (k <= 2048) the epilogue weighs more per tile, and storing it
    # through the swizzled view pays: H200, session 13 (kernel-profile-h200-2026-12-04-s13.md,
    # T=40960, d=768): down_proj 0.236 / 0.240 ms (k=512), 0.203 / 0.207 (k=1024); dx_pairs
    # 0.400 / 0.408 (k=1024), 0.367 / 0.379 (k=2048). Session 6 at 30B-512 (k=512): 1.856 /
    # 1.871; session 7 at DeepSeek-V3-like's k=2048 (N=7168): 6.971 / 6.946, within noise.
    ring = dict(block_m=128, grid_tile_width=16, num_compute_wgs=2, gather=gather,
                cross_tile=True, epilogue_swizzle=k <= 2048)
    if transpose_rhs and k >= 2048 and k % 64 == 0:
      # The transposed rhs tile is (block_n rows of W1, block_k columns): block_k 32 makes
      # 64-byte TMA rows, block_k 64 full 128-byte swizzled rows. Rows split between the
      # consumers (64 x 256 each), snake width 8. H200, session 7
      # (pallas-forward-h200-2026-12-03-s7-down-sweep.md): dx_pairs 12.93 ms against 27.79
      # (64 x 256, block_k 32, 6 stages) at DeepSeek-V3-like, 3.099 against 3.132 (128 x 128
      # x 64) at 30B-1024. Shorter contractions (k < 2048) were not timed with it.
      return GemmConfig(block_n=256, block_k=64, max_concurrent_steps=3, wg_split="m",
                        **{**ring, "grid_tile_width": 8})
    if k >= 4096 and k % 32 == 0:
      # Long contractions: the warpgroups split the rows (64 x 256 each); session 6's dx_pairs
      # 7.277 / 8.934 ms at 120B-2048 (restarted pipeline), before block_k 64 above.
      return GemmConfig(block_n=256, block_k=32, max_concurrent_steps=6, wg_split="m", **ring)
    if bk == 64:
      # Snake width 8 on wide outputs: down_proj 6.558 against 6.946 ms (width 16) at
      # DeepSeek-V3-like (n = 7168); 1.659 against 1.639 at 30B-1024 (n = 4096), so 16 there.
      width = 8 if n > 4096 else 16
      return GemmConfig(block_n=128, block_k=64, max_concurrent_steps=3,
                        **{**ring, "grid_tile_width": width})
    return GemmConfig(block_n=128, block_k=32, max_concurrent_steps=6, **ring)
  if n % 128 == 0:
    return GemmConfig(block_m=128, block_n=128, block_k=bk, max_concurrent_steps=5,
                      grid_tile_width=8, gather=gather)
  bn = 64 if n % 64 == 0 else 32 if n % 32 == 0 else 8
  return GemmConfig(block_m=128, block_n=bn, block_k=bk, max_concurrent_steps=5,
                    grid_tile_width=8, gather=gather)


def swiglu_gemm_config(k: int, n: int, *, gather: GatherMode | None = None) -> GemmConfig:
  """Heuristic for the up-projection (P, k) x (k, 2n) with SwiGLU (two accumulators per tile).

  gather None: "fused" where it was measured faster (n % 128 == 0: the warp-specialized tiling,
  1.1-1.6x the XLA gather + kernel on H200 at the paper's configs), else "xla".
  """
  bk = _block_k(k)
  if gather is None:
    gather = "fused" if n % 128 == 0 else "xla"
  if gather == "fused":
    # A cp.async producer warpgroup gathers x rows into the deepest ring that fits (SMEM <= 220
    # KiB with the epilogue tiles). The two consumer warpgroups split the rows (64 x 2·128
    # each, m64n128 wgmmas): 3.705 / 3.772 ms at 30B-512, 3.806 / 3.883 at 30B-256, 16.15 /
    # 16.90 at DeepSeek-V3-like against 128 x 2·64 each; snake width 8 at n >= 2048 (7.540
    # against 7.904 ms at 120B-2048; H200, pallas-forward-h200-2026-12-03-s6.md). Width 16
    # otherwise: 7.51 against 7.77 ms at 120B-1024 (pallas-forward-h200-2026-12-02-s4-fused-v2).
    if n % 128 == 0:
      return GemmConfig(block_m=128, block_n=128, block_k=32, max_concurrent_steps=6,
                        grid_tile_width=8 if n >= 2048 else 16, num_compute_wgs=2,
                        gather=gather, epilogue_swizzle=True, wg_split="m")
    return GemmConfig(block_m=128, block_n=64 if n % 64 == 0 else 32, block_k=bk,
                      max_concurrent_steps=5, grid_tile_width=8, gather=gather)
  if n % 128 == 0:
    # 6 stages of block_k 32 (up_proj at 30B-512 on H200: 3.405 ms against 3.490 ms for 3 x 64).
    return GemmConfig(block_m=128, block_n=64, block_k=32, max_concurrent_steps=6,
                      grid_tile_width=8, num_compute_wgs=2, gather=gather,
                      epilogue_swizzle=True)
  bn = 64 if n % 64 == 0 else 32 if n % 32 == 0 else 8
  return GemmConfig(block_m=128, block_n=bn, block_k=bk, max_concurrent_steps=4,
                    grid_tile_width=8, gather=gather)


def pingpong_config(k: int, n: int, *, epilogue: Literal["none", "swiglu"] = "none",
                    gather: GatherMode = "fused") -> GemmConfig:
  """A ping-pong ring tiling (``wg_split="pingpong"``; session 32; 15-50 % slower per kernel
  than the heuristic on the H100, session 33) for a grouped GEMM with contraction ``k`` and
  ``n`` output columns (SwiGLU: n = the A width, two accumulators), to compare against the
  heuristic: 64-row tiles, one per consumer warpgroup, 128 accumulator registers each (64 x 256,
  or 64 x 2·128 with SwiGLU, m64 wgmmas), block_k 32 and the deepest ring of 6, 4 or 2 stages
  whose double divides the k steps (the ring and both epilogue tiles fit in SMEM). SwiGLU
  gathers x in the kernel (``gather``); the plain GEMMs use the cross-tile ring. ValueError
  where n is not a multiple of the tile width or k / 32 not of 4."""
  swiglu = epilogue == "swiglu"
  bn = 128 if swiglu else 256
  k_steps = k // 32
  if n % bn or k % 32 or k_steps % 4:
    raise ValueError(f"pingpong_config: n ({n}) must be a multiple of {bn} and k ({k}) of 128")
  stages = next(s for s in (6, 4, 2) if k_steps % (2 * s) == 0)
  return GemmConfig(block_m=64, block_n=bn, block_k=32, max_concurrent_steps=stages,
                    grid_tile_width=8 if n >= 2048 else 16, num_compute_wgs=2,
                    gather=gather if swiglu else "xla",
                    cross_tile=not (swiglu and gather == "fused"), epilogue_swizzle=True,
                    wg_split="pingpong")


def combine_config(d: int, impl: Literal["xla", "mosaic"] = "xla") -> CombineConfig:
  for bd in (256, 192, 128, 64, 32, 16, 8):
    if d % bd == 0:
      return CombineConfig(impl=impl, block_d=bd)
  return CombineConfig(impl=impl, block_d=8)


# ----------------------------------------------------------------------------- autotuning

_CACHE_ENV = "SONIC_JAX_AUTOTUNE_CACHE"


def _cache_path() -> str:
  return os.environ.get(_CACHE_ENV, os.path.expanduser("~/.cache/sonic_jax/pallas_autotune.json"))


def load_cached(key: str) -> GemmConfig | None:
  """The cached GemmConfig for ``key`` (see ``autotune``), or None."""
  try:
    with open(_cache_path()) as f:
      entry = json.load(f).get(key)
  except (OSError, ValueError):
    return None
  return GemmConfig(**entry) if entry else None


def autotune(key: str, run: Callable[[GemmConfig], object], candidates: list[GemmConfig],
             *, measure: Callable[[Callable[[], object]], float] | None = None) -> GemmConfig:
  """Times ``run(config)`` for each candidate on the current device; caches and returns the best.

  key: a string naming the problem (kernel, shapes, device kind). ``measure`` returns seconds for
  a thunk (default: ``sonic_jax.bench.timing.time_thunk``, block_until_ready wall time, median of
  5 after a warm-up); candidates that fail to compile (e.g. too much SMEM) are skipped.
  """
  cached = load_cached(key)
  if cached is not None:
    return cached
  if measure is None:
    def measure(thunk):
      from sonic_jax.bench import timing  # lazy: keeps this module free of jax at import
      return timing.time_thunk(thunk, warmup=1, iters=5).median_ms / 1e3
  best, best_t = None, float("inf")
  for cfg in candidates:
    try:
      t = measure(lambda cfg=cfg: run(cfg))
    except Exception:  # noqa: BLE001 - a candidate that does not compile is just skipped
      continue
    if t < best_t:
      best, best_t = cfg, t
  if best is None:
    raise ValueError(f"autotune: no candidate config ran for {key!r}")
  path = _cache_path()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    data = {}
  data[key] = dataclasses.asdict(best)
  with open(path, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  return best
