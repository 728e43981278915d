"""Pallas backward kernels (dh, dw1, dw2) against the xla backend.

CPU tests run the Mosaic GPU kernels in the GPU interpreter at tiny shapes; they cover empty
experts, groups straddling tiles, one expert taking every token, E not a power of two, and NaN
in padding rows (which the kernels must neither read into valid results nor write). GPU tests
(``@pytest.mark.gpu``) run the lowered kernels at real sizes. Errors are relative Frobenius
norms against the xla backend; NaN never passes (``_rel`` returns inf for it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from sonic_jax.pallas.dh import DhConfig, dh, dh_config_for, smem_bytes, validate_dh_shapes
from sonic_jax.pallas import wgrad as wgrad_lib
from sonic_jax.pallas.wgrad import WgradConfig, dw1, dw2, wgrad_config_for
from sonic_jax.routing import RoutingPlan
from sonic_jax.xla_backend import XlaKernels

XLA = XlaKernels()
DH_CFG = DhConfig(block_m=64, block_n=128, block_k=64, epi_n=64)  # two epilogue chunks
WG_CFG = WgradConfig(block_m=64, block_n=64, block_k=64)
WG_FUSED_CFG = WgradConfig(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2,
                           gather="fused")
# bf16 outputs round at 2^-9 relative; fp32 results (dS) are checked much tighter.
BF16_TOL = 8e-3
F32_TOL = 1e-4


def _rel(a, b) -> float:
  a = np.asarray(a, np.float32)
  b = np.asarray(b, np.float32)
  if not np.all(np.isfinite(a)):
    return float("inf")
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_plan(sizes, num_tokens: int, top_k: int, *, capacity: int | None = None,
              seed: int = 0) -> RoutingPlan:
  """A plan whose experts get exactly ``sizes`` pairs; ``capacity`` > sum adds padding rows."""
  sizes = list(sizes)
  pairs = sum(sizes)
  assert pairs <= num_tokens * top_k
  rng = np.random.default_rng(seed)
  experts = np.concatenate([np.full(s, e, np.int32) for e, s in enumerate(sizes)])
  rng.shuffle(experts)
  tokens = np.sort(rng.choice(num_tokens * top_k, pairs, replace=False)) // top_k
  capacity = capacity or pairs
  pad = capacity - pairs
  valid = np.arange(capacity) < pairs
  scores = rng.uniform(0.1, 1.0, capacity).astype(np.float32)
  exact_topk = pairs == num_tokens * top_k and pad == 0
  return RoutingPlan.from_assignments(
      jnp.asarray(np.concatenate([tokens, np.zeros(pad, np.int64)])),
      jnp.asarray(np.concatenate([experts, np.zeros(pad, np.int32)])),
      jnp.asarray(scores), num_tokens=num_tokens, num_experts=len(sizes),
      valid=jnp.asarray(valid), top_k=top_k if exact_topk else None)


# (group sizes, T, K, capacity): E = 5 with an empty expert, a 1-row expert and groups that
# straddle 64-row tiles; every token on one expert of 3; padding rows past the groups.
CASES = {
    "straddle_e5": ([0, 70, 1, 40, 17], 64, 2, None),
    "one_expert_e3": ([0, 96, 0], 96, 1, None),
    "padding_e6": ([9, 0, 65, 3, 0, 20], 64, 2, 128),
}


def _inputs(case, d=128, n=128, seed=1):
  sizes, t, k, cap = CASES[case]
  plan = make_plan(sizes, t, k, capacity=cap)
  keys = jax.random.split(jax.random.key(seed), 5)
  e, p = len(sizes), plan.capacity
  bf = jnp.bfloat16
  valid = plan.valid_mask()[:, None]
  # Padding rows of the P-sized operands hold NaN: a kernel that reads them into a valid
  # result, or fails to mask them in a reduction, fails the test.
  nan_pad = lambda a: jnp.where(valid, a, jnp.nan).astype(bf)
  return dict(
      plan=plan,
      x=jax.random.normal(keys[0], (t, d), bf),
      dout=jax.random.normal(keys[1], (t, d), bf),
      w2=(jax.random.normal(keys[2], (e, n, d)) / np.sqrt(d)).astype(bf),
      h=nan_pad(jax.random.normal(keys[3], (p, 2 * n))),
      dh=nan_pad(jax.random.normal(keys[4], (p, 2 * n))),
      a_prime=nan_pad(jax.random.normal(keys[3], (p, n))),
  )


@pytest.mark.parametrize("case", sorted(CASES))
def test_dh_matches_xla(case):
  a = _inputs(case)
  plan = a["plan"]
  s = plan.grouped_scores()
  got = jax.jit(lambda *args: dh(*args, config=DH_CFG, interpret=True))(
      a["dout"], a["w2"], a["h"], s, plan)
  want = XLA.dh(a["dout"], a["w2"], a["h"], s, plan)
  m = np.asarray(plan.valid_mask())
  d_h, a_p, d_s = (np.asarray(v, np.float32)[m] for v in got)
  w_dh, w_ap, w_ds = (np.asarray(v, np.float32)[m] for v in want)
  assert _rel(d_s, w_ds) < F32_TOL, "dS"
  assert _rel(d_h, w_dh) < BF16_TOL, "dH"
  assert _rel(a_p, w_ap) < BF16_TOL, "A'"
  # The gate and up halves separately (a swapped concat layout would still match in norm
  # only by accident, but check anyway).
  n = a_p.shape[1]
  assert _rel(d_h[:, :n], w_dh[:, :n]) < BF16_TOL, "dH gate half"
  assert _rel(d_h[:, n:], w_dh[:, n:]) < BF16_TOL, "dH up half"
  assert np.all(np.asarray(got[2])[~m] == 0.0), "dS on padding rows"
  if (~m).any():
    # Tiles straddle the last group's end; the ragged stores must stop at its last row. The
    # interpreter fills fresh outputs with NaN, so rows past the groups stay NaN exactly when
    # no store touched them.
    assert np.all(np.isnan(np.asarray(got[0], np.float32)[~m])), "dH written past the groups"
    assert np.all(np.isnan(np.asarray(got[1], np.float32)[~m])), "A' written past the groups"


# dH with the dO row gather fused into the kernel (DhConfig(gather="fused"), opt-in): a producer
# warpgroup fills a cross-tile ring (W2 by TMA, gathered dO rows by cp.async; the interpreter
# runs the same protocol with plain copies and Pallas barriers), one consumer runs the wgmma
# and the epilogue. 2 stages at d = 128, block_k = 64: the ring is exactly the tile's k steps.
DH_FUSED_CFG = dataclasses.replace(DH_CFG, max_concurrent_steps=2, gather="fused")
# The same warp-specialized ring kernel fed by TMA from XLA's gathered dO (DhConfig(ring=True)).
DH_RING_CFG = dataclasses.replace(DH_CFG, max_concurrent_steps=2, ring=True)
RING_CFGS = {"fused": DH_FUSED_CFG, "ring": DH_RING_CFG,
             # Two consumer warpgroups splitting each 128-row tile (64 rows each).
             "fused-2wg": dataclasses.replace(DH_FUSED_CFG, block_m=128, num_consumers=2),
             "ring-2wg": dataclasses.replace(DH_RING_CFG, block_m=128, num_consumers=2),
             # Two consumers side by side on 64 columns each (CTA tile 64 x 128), H from SMEM or
             # read from HBM straight into registers; the one-consumer ring reading H from HBM.
             # P = 96 ("one_expert_e3") is not a multiple of block_m: H is padded for the HBM reads.
             "ring-2wg-n": dataclasses.replace(DH_RING_CFG, block_n=64, num_consumers=2,
                                               consumer_split="n"),
             "ring-2wg-n-gmem": dataclasses.replace(DH_RING_CFG, block_n=64, num_consumers=2,
                                                    consumer_split="n", h_source="gmem"),
             "fused-2wg-n-gmem": dataclasses.replace(DH_FUSED_CFG, block_n=64, num_consumers=2,
                                                     consumer_split="n", h_source="gmem"),
             "ring-gmem": dataclasses.replace(DH_RING_CFG, h_source="gmem"),
             # Fewer staging buffers than outputs: each output stored as soon as written.
             "ring-2wg-n-gmem-1buf": dataclasses.replace(
                 DH_RING_CFG, block_n=64, num_consumers=2, consumer_split="n", h_source="gmem",
                 epi_buffers=1),
             "fused-2buf": dataclasses.replace(DH_FUSED_CFG, epi_buffers=2),
             # The fused default at d >= 4096 in small: rows split, H from HBM, 2 buffers.
             "fused-2wg-gmem-2buf": dataclasses.replace(
                 DH_FUSED_CFG, block_m=128, num_consumers=2, h_source="gmem", epi_buffers=2),
             # H loads issued ahead (chunk 0 before the K loop, chunk c + 1 with chunk c).
             "ring-gmem-prefetch": dataclasses.replace(DH_RING_CFG, h_source="gmem",
                                                       h_prefetch=True),
             "fused-2wg-gmem-prefetch": dataclasses.replace(
                 DH_FUSED_CFG, block_m=128, num_consumers=2, h_source="gmem", h_prefetch=True,
                 epi_buffers=2),
             # Chunk 0's H loads issued after the K loop's last wgmma, chunk c + 1's with
             # chunk c (DhConfig.h_lookahead).
             "ring-gmem-lookahead": dataclasses.replace(DH_RING_CFG, h_source="gmem",
                                                        h_lookahead=True),
             "fused-2wg-gmem-2buf-lookahead-swz": dataclasses.replace(
                 DH_FUSED_CFG, block_m=128, num_consumers=2, h_source="gmem", epi_buffers=2,
                 h_lookahead=True, epilogue_swizzle=True),
             # Swizzled staging for full row windows (one TMA per output), the ladder for
             # ragged ones: three buffers with H from SMEM, two with H from HBM, one buffer.
             "ring-2wg-swz": dataclasses.replace(DH_RING_CFG, block_m=128, num_consumers=2,
                                                 epilogue_swizzle=True),
             "fused-2wg-gmem-2buf-swz": dataclasses.replace(
                 DH_FUSED_CFG, block_m=128, num_consumers=2, h_source="gmem", epi_buffers=2,
                 epilogue_swizzle=True),
             "ring-1buf-swz": dataclasses.replace(DH_RING_CFG, epi_buffers=1,
                                                  epilogue_swizzle=True),
             # Two consumers per CTA, each with its own ring fed by one producer, taking
             # alternate work items (a ping-pong of the epilogue against the other's wgmmas).
             "ring-2pipes": dataclasses.replace(DH_RING_CFG, pipelines=2, block_n=64),
             "fused-2pipes-gmem-swz": dataclasses.replace(
                 DH_FUSED_CFG, pipelines=2, h_source="gmem", epi_buffers=2,
                 epilogue_swizzle=True),

             # 2-CTA clusters (DhConfig.cluster_m): pair tiles, each CTA its tile of the pair
             # (the interpreter has no cluster barriers: no multicast there).
             "fused-cluster2": dataclasses.replace(DH_FUSED_CFG, cluster_m=2),
             "ring-2wg-n-gmem-cluster2": dataclasses.replace(
                 DH_RING_CFG, block_n=64, num_consumers=2, consumer_split="n", h_source="gmem",
                 cluster_m=2)}

# The wide ring kernel: two consumers side by side (CTA tile 128 x 256), H read from HBM into
# registers, two staging buffers per consumer, 3 stages of block_k 64 (or 6 of 32).
WIDE_DH = dict(block_n=128, epi_n=64, ctas_per_sm=1, num_consumers=2, consumer_split="n",
               h_source="gmem", max_concurrent_steps=3, epi_buffers=2)



def _assert_dh_matches(got, want, plan):
  """dS, dH (each half), A' by relative error on valid rows; dS 0 and dH / A' unwritten (NaN in
  the interpreter's fresh outputs) on padding rows."""
  m = np.asarray(plan.valid_mask())
  d_h, a_p, d_s = (np.asarray(v, np.float32)[m] for v in got)
  w_dh, w_ap, w_ds = (np.asarray(v, np.float32)[m] for v in want)
  n = a_p.shape[1]
  assert _rel(d_s, w_ds) < F32_TOL, "dS"
  assert _rel(d_h[:, :n], w_dh[:, :n]) < BF16_TOL, "dH gate half"
  assert _rel(d_h[:, n:], w_dh[:, n:]) < BF16_TOL, "dH up half"
  assert _rel(a_p, w_ap) < BF16_TOL, "A'"
  assert np.all(np.asarray(got[2])[~m] == 0.0), "dS on padding rows"
  if (~m).any():
    assert np.all(np.isnan(np.asarray(got[0], np.float32)[~m])), "dH written past the groups"
    assert np.all(np.isnan(np.asarray(got[1], np.float32)[~m])), "A' written past the groups"


def _run_dh(a, config):
  plan = a["plan"]
  s = plan.grouped_scores()
  got = jax.jit(lambda *args: dh(*args, config=config, interpret=True))(
      a["dout"], a["w2"], a["h"], s, plan)
  return got, XLA.dh(a["dout"], a["w2"], a["h"], s, plan)


@pytest.mark.parametrize("kind", sorted(RING_CFGS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_dh_fused_gather_matches_xla(case, kind):
  """The ring kernel, gathering dO itself ("fused") or fed XLA's gathered dO by TMA ("ring"):
  empty experts, a 1-row expert, groups straddling tiles, every token on one expert, padding
  rows holding NaN, E = 3, 5, 6."""
  a = _inputs(case)
  got, want = _run_dh(a, RING_CFGS[kind])
  _assert_dh_matches(got, want, a["plan"])


@pytest.mark.parametrize("d,block_k,stages", [
    (64, 64, 2),  # one k step per tile: every step of a tile is its last
    (256, 64, 3),  # 4 k steps on 3 slots: the ring wraps mid-tile, tiles start on any slot
    (128, 32, 2),  # 4 k steps of 32 columns on 2 slots (a 64-byte swizzle on the GPU)
])
@pytest.mark.parametrize("kind", sorted(RING_CFGS))
def test_dh_fused_gather_ring_depths(d, block_k, stages, kind):
  a = _inputs("straddle_e5", d=d)
  cfg = dataclasses.replace(RING_CFGS[kind], block_k=block_k, max_concurrent_steps=stages)
  got, want = _run_dh(a, cfg)
  _assert_dh_matches(got, want, a["plan"])


@pytest.mark.parametrize("name", ["straddle_e5", "one_expert_e3", "padding_e6"])
@pytest.mark.parametrize("gather", ["fused", "xla"])
def test_dh_shared_pipeline_ring_matches_xla(name, gather):
  """DhConfig(pipelines=2, pipeline_ring="shared") (d / block_k = 8, a multiple of 2 x 2
  stages), which the interpreter runs as the split rings: the configuration's path to the
  kernel and the fallback, dH / A' / dS against xla."""
  a = _inputs(name, d=256)
  base = DH_FUSED_CFG if gather == "fused" else DH_RING_CFG
  cfg = dataclasses.replace(base, pipelines=2, pipeline_ring="shared", block_k=32,
                            h_source="gmem", epi_buffers=2)
  got, want = _run_dh(a, cfg)
  _assert_dh_matches(got, want, a["plan"])


def test_dh_fused_gather_validation():
  a = _inputs("straddle_e5")
  plan = a["plan"]
  s = plan.grouped_scores()
  with pytest.raises(ValueError, match="DhConfig.gather must be 'xla' or 'fused'"):
    DhConfig(gather="tma")
  for bk in (8, 48, 192):  # 16 bytes; 96 bytes; 384 bytes (a multiple of 128 not dividing 2048)
    with pytest.raises(ValueError, match="DhConfig.block_k with gather='fused'"):
      DhConfig(block_k=bk, gather="fused")
  DhConfig(block_k=48)  # the XLA gather has no such rule
  for kw in (dict(gather="fused"), dict(ring=True)):
    with pytest.raises(ValueError, match="DhConfig.max_concurrent_steps must be >= 2"):
      DhConfig(max_concurrent_steps=1, **kw)
  with pytest.raises(ValueError, match="DhConfig.num_consumers must be 1 or 2"):
    DhConfig(ring=True, num_consumers=3)
  for kw in (dict(), dict(ring=True, block_m=64)):  # the default kernel; 32-row halves
    with pytest.raises(ValueError, match="DhConfig.num_consumers = 2 needs the ring kernel"):
      DhConfig(num_consumers=2, **kw)
  assert DhConfig(ring=True).warp_specialized and not DhConfig().warp_specialized
  assert smem_bytes(DhConfig(ring=True)) == smem_bytes(DhConfig(gather="fused"))
  with pytest.raises(ValueError, match="dout_gathered must be None"):
    dh(a["dout"], a["w2"], a["h"], s, plan, config=DH_FUSED_CFG, interpret=True,
       dout_gathered=a["dout"][plan.gather_idx])
  # Nothing is reused across the cross-tile ring: H tiles + 4 stages + an output chunk overflow.
  big = DhConfig(block_n=128, max_concurrent_steps=4, gather="fused")
  assert smem_bytes(big) > 220 * 1024
  with pytest.raises(ValueError, match="bytes of SMEM"):
    dh(a["dout"], a["w2"], a["h"], s, plan, config=big, interpret=True)


def test_dh_config_for_fused_gather():
  """The fused heuristic: at d >= 768 with n % 256 == 0 the row-split 128 x 256 tile (H from
  HBM); otherwise the default tiles and the deepest ring (<= 4) that fits."""
  for d, n in ((4096, 384), (768, 192), (512, 512), (1024, 640)):
    cfg = dh_config_for(d, n, gather="fused")
    assert cfg.gather == "fused" and cfg.ctas_per_sm == 1 and cfg.num_consumers == 1
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.epi_n) == (
        128, 128 if n % 128 == 0 else 64, 64, 64)
    assert smem_bytes(cfg) <= 220 * 1024
    deeper = dataclasses.replace(cfg, max_concurrent_steps=cfg.max_concurrent_steps + 1)
    assert cfg.max_concurrent_steps == 4 or smem_bytes(deeper) > 220 * 1024
  assert dh_config_for(4096, 384, gather="fused").max_concurrent_steps == 3
  for d, n in ((4096, 256), (4096, 512), (7168, 2048), (768, 256), (1536, 256), (1024, 512),
               (2048, 1024)):
    cfg = dh_config_for(d, n, gather="fused")
    assert (cfg.gather, cfg.block_n, cfg.num_consumers, cfg.consumer_split, cfg.h_source,
            cfg.epilogue_swizzle) == ("fused", 256, 2, "m", "gmem", True)
    assert smem_bytes(cfg) <= 220 * 1024
    validate_dh_shapes(d, n, cfg)


def test_dh_config_for_xla_gather_two_ctas_per_sm_at_small_d():
  """d < 1536 with n % 128 == 0: the row-split ring on a 128 x 128 tile, H prefetched into SMEM,
  swizzled staging; other d <= 1536: 64-column tiles, 3 stages, two resident CTAs per SM (their
  SMEM fits twice); d >= 1536 with n % 256 == 0: the row-split 128 x 256 ring, H from HBM;
  other larger d keeps one CTA with 128-column tiles; a ctas_per_sm whose SMEM cannot fit
  fails."""
  for d, n in ((768, 512), (768, 1024), (1024, 512), (1024, 384), (512, 256)):
    cfg = dh_config_for(d, n)
    assert (cfg.ring, cfg.block_n, cfg.num_consumers, cfg.consumer_split, cfg.h_source,
            cfg.epilogue_swizzle, cfg.ctas_per_sm) == (True, 128, 2, "m", "smem", True, 1)
    assert smem_bytes(cfg) <= 220 * 1024
    validate_dh_shapes(d, n, cfg)
  for d, n in ((768, 192), (1024, 320), (1536, 384)):
    cfg = dh_config_for(d, n)
    assert (cfg.block_n, cfg.epi_n, cfg.max_concurrent_steps, cfg.ctas_per_sm) == (64, 64, 3, 2)
    validate_dh_shapes(d, n, cfg)
  for d in (1536, 2048, 4096, 7168):  # the row-split 128 x 256 ring kernel where n % 256 == 0
    cfg = dh_config_for(d, 1024)
    assert (cfg.block_n, cfg.ctas_per_sm, cfg.num_consumers, cfg.consumer_split) == (
        256, 1, 2, "m")
    assert (cfg.ring, cfg.h_source, cfg.block_k, cfg.epilogue_swizzle) == (True, "gmem", 32, True)
    assert smem_bytes(cfg) <= 220 * 1024
    validate_dh_shapes(d, 1024, cfg)
  for d, n in ((2048, 640), (4096, 384)):  # n % 256 != 0: the one-warpgroup 128-column kernel
    cfg = dh_config_for(d, n)
    assert (cfg.block_n, cfg.ctas_per_sm, cfg.ring) == (128, 1, False)
  with pytest.raises(ValueError, match="DhConfig.ctas_per_sm = 2 needs"):
    validate_dh_shapes(1024, 512, DhConfig(ctas_per_sm=2))  # 128-column tiles: 192 KiB each
  with pytest.raises(ValueError, match="DhConfig.ctas_per_sm must be a positive int"):
    DhConfig(ctas_per_sm=0)


@pytest.mark.parametrize("case", ["straddle_e5", "padding_e6"])
def test_dh_two_ctas_per_sm_matches_xla(case):
  """ctas_per_sm = 2 doubles the persistent grid (4 CTAs in the interpreter): every work item is
  still computed once."""
  a = _inputs(case)
  got, want = _run_dh(a, dataclasses.replace(DH_CFG, block_n=64, ctas_per_sm=2))
  _assert_dh_matches(got, want, a["plan"])


@pytest.mark.parametrize("ctas", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dh_swizzled_epilogue_matches_xla(case, ctas):
  """The one-warpgroup kernel with DhConfig.epilogue_swizzle: full 64-row tiles stored through
  the swizzled view with one TMA each, ragged ones by the ladder (straddle_e5 and one_expert_e3
  have both)."""
  a = _inputs(case)
  # Two CTAs per SM fit with 64-column tiles (one epilogue chunk; DH_CFG has two).
  cfg = DH_CFG if ctas == 1 else dataclasses.replace(DH_CFG, block_n=64, ctas_per_sm=2)
  got, want = _run_dh(a, dataclasses.replace(cfg, epilogue_swizzle=True))
  _assert_dh_matches(got, want, a["plan"])


def test_dh_swizzled_epilogue_lowers_to_mosaic_gpu():
  """dh_config_for's d <= 1536 kernel (64-column tiles, two CTAs per SM) with the swizzled
  epilogue lowers for CUDA on the CPU host: both views of the staging buffers, their TMA stores."""
  cfg = DhConfig(num_sms=132, block_n=64, epi_n=64, max_concurrent_steps=3, ctas_per_sm=2,
                 epilogue_swizzle=True)
  text = _dh_cuda_text(cfg)
  assert "mosaic_gpu" in text


def _dh_cuda_text(cfg: DhConfig, n: int = 128) -> str:
  """dh with ``cfg`` lowered for CUDA on the CPU host (d = 256), as text."""
  a = _inputs("straddle_e5", d=256, n=n)
  plan = a["plan"]
  f = lambda *args: dh(*args, config=cfg)
  return jax.jit(f).trace(a["dout"], a["w2"], a["h"], plan.grouped_scores(), plan).lower(
      lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("cfg", [
    DhConfig(num_sms=132, max_concurrent_steps=3, gather="fused"),  # dh_config_for's, n % 128 == 0
    DhConfig(block_n=64, block_k=32, max_concurrent_steps=6, gather="fused", num_sms=132),
    DhConfig(block_n=64, block_k=128, max_concurrent_steps=2, gather="fused", num_sms=132),
    DhConfig(num_sms=132, max_concurrent_steps=3, gather="fused", num_consumers=2),
], ids=["128x128x64", "128x64x32", "128x64x128", "2wg-128x128x64"])
def test_dh_fused_gather_lowers_to_mosaic_gpu(cfg):
  """Lowers the fused-gather dh for CUDA on the CPU host: Mosaic GPU layout inference and MLIR
  generation, including the inline cp.async gather (64- and 128-byte swizzles, a tile row of two
  128-byte swizzle columns) and its mbarrier waits."""
  text = _dh_cuda_text(cfg)
  assert "mosaic_gpu" in text
  for op in ("cp.async.shared.global", "cp.async.mbarrier.arrive", "mbarrier.try_wait.parity"):
    assert op in text, op


@pytest.mark.parametrize("consumers", [1, 2])
def test_dh_ring_lowers_to_mosaic_gpu(consumers):
  """The TMA-fed ring kernel (DhConfig(ring=True)) lowers for CUDA on the CPU host: warp
  specialization with mbarrier waits and no cp.async; with two consumers each takes 64-row
  slices of the ring's dO tiles."""
  text = _dh_cuda_text(
      DhConfig(num_sms=132, max_concurrent_steps=3, ring=True, num_consumers=consumers))
  assert "mosaic_gpu" in text
  # Producer / consumer register split, TMA loads and their mbarrier waits; no cp.async gather.
  for op in ("setmaxnreg.dec", "setmaxnreg.inc", "nvvm.cp.async.bulk.tensor.shared.cluster.global",
             "nvvm.mbarrier.try_wait.parity"):
    assert op in text, op
  assert "cp.async.shared.global" not in text


# The row-split variant of the wide tile: each consumer 64 rows x 256 columns (m64n256 wgmmas),
# as dx_pairs splits its tile; dh_config_for's default at d >= 2048 since session 11.
WIDE_M_DH = dict(block_n=256, epi_n=64, ctas_per_sm=1, num_consumers=2, consumer_split="m",
                 h_source="gmem", block_k=32, max_concurrent_steps=6, epi_buffers=2)


@pytest.mark.parametrize("kw", [dict(ring=True),
                                dict(ring=True, block_k=32, max_concurrent_steps=6),
                                dict(gather="fused"), dict(ring=True, h_prefetch=True),
                                dict(ring=True, **WIDE_M_DH),
                                dict(ring=True, **WIDE_M_DH, h_prefetch=True),
                                dict(ring=True, **WIDE_M_DH, h_lookahead=True,
                                     epilogue_swizzle=True),
                                dict(gather="fused", **WIDE_M_DH),
                                dict(ring=True, **WIDE_M_DH, epilogue_swizzle=True),
                                dict(ring=True, **{**WIDE_M_DH, "block_n": 128,
                                                   "h_source": "smem"}, epilogue_swizzle=True),
                                dict(ring=True, **{**WIDE_M_DH, "block_m": 64, "num_consumers": 1,
                                                   "max_concurrent_steps": 4},
                                     pipelines=2, epilogue_swizzle=True),
                                dict(gather="fused", **{**WIDE_M_DH, "block_m": 64,
                                                        "num_consumers": 1,
                                                        "max_concurrent_steps": 4},
                                     pipelines=2, epilogue_swizzle=True),
                                dict(ring=True, **WIDE_M_DH, epilogue_swizzle=True, cluster_m=2),
                                dict(gather="fused", **WIDE_M_DH, cluster_m=2),
                                dict(ring=True, cluster_m=2),
                                dict(ring=True, **{**WIDE_M_DH, "block_m": 64, "num_consumers": 1,
                                                   "max_concurrent_steps": 4},
                                     pipelines=2, pipeline_ring="shared", epilogue_swizzle=True),
                                dict(gather="fused", **{**WIDE_M_DH, "block_m": 64,
                                                        "num_consumers": 1,
                                                        "max_concurrent_steps": 4},
                                     pipelines=2, pipeline_ring="shared")],
                         ids=["ring", "ring-k32", "fused", "ring-prefetch", "rows-64x256",
                              "rows-64x256-prefetch", "rows-64x256-lookahead-swz",
                              "fused-rows-64x256", "rows-64x256-swz", "rows-64x128-smem-swz",
                              "2pipes-64x256", "fused-2pipes-64x256", "rows-64x256-swz-cluster2",
                              "fused-rows-64x256-cluster2", "ring-cluster2",
                              "2pipes-64x256-shared", "fused-2pipes-64x256-shared"])
def test_dh_wide_lowers_to_mosaic_gpu(kw):
  """The wide ring kernel (two consumers side by side on a 128 x 256 CTA tile, H read from HBM
  into registers) lowers for CUDA on the CPU host within the SMEM limit: no H tiles in SMEM."""
  cfg = DhConfig(num_sms=132, **{**WIDE_DH, **kw})
  assert smem_bytes(cfg) <= 220 * 1024
  text = _dh_cuda_text(cfg, n=256)
  assert "mosaic_gpu" in text and "setmaxnreg.inc" in text
  if cfg.pipeline_ring == "shared":
    # One ring (half the split rings' SMEM) and the two turn barriers' waits and arrivals.
    assert smem_bytes(cfg) < smem_bytes(dataclasses.replace(cfg, pipeline_ring="split"))
  if cfg.pipelines == 2:
    # One producer feeds both rings: three warpgroups, the two consumers raised to 232
    # registers. A producer per pipeline (four warpgroups) capped ptxas at 128 (session 14).
    assert "setmaxnreg.inc.sync.aligned.u32 232" in text


def test_dh_cluster_validation():
  with pytest.raises(ValueError, match="cluster_m must be 1 or 2"):
    DhConfig(ring=True, cluster_m=3)
  for kw in (dict(), dict(ring=True, pipelines=2), dict(ring=True, ctas_per_sm=2)):
    with pytest.raises(ValueError, match="cluster_m = 2 needs the ring kernel"):
      DhConfig(cluster_m=2, **kw)
  assert DhConfig(gather="fused", cluster_m=2).cluster_m == 2
  assert DhConfig().cluster_m == 1  # not yet run on a GPU


def test_dh_wide_validation():
  with pytest.raises(ValueError, match="must be a multiple of the dh CTA tile's columns"):
    validate_dh_shapes(1024, 128, DhConfig(ring=True, **WIDE_DH))
  with pytest.raises(ValueError, match="h_source = 'gmem' needs the ring kernel"):
    DhConfig(h_source="gmem")
  with pytest.raises(ValueError, match="consumer_split must be"):
    DhConfig(ring=True, consumer_split="k")
  with pytest.raises(ValueError, match="h_prefetch needs h_source = 'gmem'"):
    DhConfig(ring=True, h_prefetch=True)
  with pytest.raises(ValueError, match="h_lookahead needs h_source = 'gmem' and h_prefetch"):
    DhConfig(ring=True, h_lookahead=True)
  with pytest.raises(ValueError, match="h_lookahead needs h_source = 'gmem' and h_prefetch"):
    DhConfig(ring=True, h_source="gmem", h_prefetch=True, h_lookahead=True)
  with pytest.raises(ValueError, match="epi_buffers must be 1, 2 or 3"):
    DhConfig(ring=True, epi_buffers=0)
  with pytest.raises(ValueError, match="pipelines must be 1 or 2"):
    DhConfig(ring=True, pipelines=3)
  with pytest.raises(ValueError, match="pipelines = 2 needs the ring kernel"):
    DhConfig(pipelines=2)
  with pytest.raises(ValueError, match="pipelines = 2 needs the ring kernel"):
    DhConfig(ring=True, pipelines=2, num_consumers=2, block_m=128)
  # Each pipeline holds its own ring and staging: twice the SMEM of one.
  one = DhConfig(ring=True, block_m=64, block_n=256, block_k=32, max_concurrent_steps=4,
                 h_source="gmem", epi_buffers=2)
  assert smem_bytes(dataclasses.replace(one, pipelines=2)) == 2 * smem_bytes(one)
  # The shared ring: one ring, each consumer its staging.
  shared = dataclasses.replace(one, pipelines=2, pipeline_ring="shared")
  ring_bytes = 4 * (64 * 32 + 256 * 32) * 2
  assert smem_bytes(shared) == 2 * smem_bytes(one) - ring_bytes
  with pytest.raises(ValueError, match="pipeline_ring must be 'split' or 'shared'"):
    dataclasses.replace(shared, pipeline_ring="one")
  with pytest.raises(ValueError, match="pipeline_ring = 'shared' needs pipelines = 2"):
    dataclasses.replace(one, pipeline_ring="shared")
  validate_dh_shapes(1536, 256, shared)  # 48 k steps: a multiple of 2 x 4
  with pytest.raises(ValueError, match=r"pipeline_ring = 'shared' needs d / block_k \(1344 / "
                     r"32 = 42\) to be a multiple of 2 x max_concurrent_steps \(8\)"):
    validate_dh_shapes(1344, 256, shared)
  validate_dh_shapes(1344, 256, dataclasses.replace(shared, pipeline_ring="split"))
  # Two staging buffers instead of three leave room for the third stage.
  assert smem_bytes(DhConfig(ring=True, **{**WIDE_DH, "epi_buffers": 3})) > 220 * 1024
  # H from HBM frees 2 x 64 KiB of SMEM: the same tiles with H in SMEM do not fit.
  with pytest.raises(ValueError, match="bytes of SMEM"):
    validate_dh_shapes(1024, 256, DhConfig(ring=True, **{**WIDE_DH, "h_source": "smem"}))


@pytest.mark.parametrize("gather", ["xla", "fused", "ring"])
def test_dh_writes_dh_over_h_in_place(gather):
  """The CUDA lowering aliases H (operand 3 or 4) with an output: dH reuses H's buffer, so the
  backward never holds H and dH as two (P, 2n) arrays (the layer's peak memory)."""
  kind = dict(ring=True) if gather == "ring" else dict(gather=gather)
  text = _dh_cuda_text(DhConfig(num_sms=132, max_concurrent_steps=3, **kind))
  aliases = [ln for ln in text.splitlines() if "mosaic_gpu" in ln and "output_operand_alias" in ln]
  assert len(aliases) == 1, "dh's kernel must alias H with its dH output"
  h_operand = 4 if gather == "fused" else 3  # (meta, [gidx,] lhs/dout, w2, h, scores)
  assert f"operand_index = {h_operand}," in aliases[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_dw1_dw2_match_xla(case):
  a = _inputs(case)
  plan = a["plan"]
  f = jax.jit(lambda x, dout, dh_, ap: (
      dw1(x, dh_, plan, config=WG_CFG, interpret=True),
      dw2(dout, ap, plan, config=WG_CFG, interpret=True)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  _assert_wgrad_matches(g1, g2, plan, XLA.dw1(a["x"], a["dh"], plan),
                        XLA.dw2(a["dout"], a["a_prime"], plan))


def _assert_wgrad_matches(g1, g2, plan, w1, w2):
  assert g1.shape == w1.shape and g2.shape == w2.shape
  for e, size in enumerate(np.asarray(plan.group_sizes)):
    if size == 0:
      assert np.all(np.asarray(g1[e]) == 0) and np.all(np.asarray(g2[e]) == 0), f"expert {e}"
    else:
      assert _rel(g1[e], w1[e]) < BF16_TOL, f"dW1 expert {e}"
      assert _rel(g2[e], w2[e]) < BF16_TOL, f"dW2 expert {e}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_dw1_dw2_fused_gather_matches_xla(case):
  """The in-kernel row gather (x for dW1, dO for dW2): empty experts, a 1-row expert, groups
  straddling K blocks, every token on one expert, NaN in padding rows of dH / A'."""
  a = _inputs(case)
  plan = a["plan"]
  f = jax.jit(lambda x, dout, dh_, ap: (
      dw1(x, dh_, plan, config=WG_FUSED_CFG, interpret=True),
      dw2(dout, ap, plan, config=WG_FUSED_CFG, interpret=True)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  _assert_wgrad_matches(g1, g2, plan, XLA.dw1(a["x"], a["dh"], plan),
                        XLA.dw2(a["dout"], a["a_prime"], plan))


def test_wgrad_fused_gather_wide_tiles_float32():
  """128-column gathered tiles (two 128-byte swizzle columns on the GPU), a 3-deep ring over
  (64-row) K blocks of many experts, fp32 output: the ring wraps inside and across tiles."""
  a = _inputs("padding_e6", d=256, n=128)
  plan = a["plan"]
  cfg = WgradConfig(block_m=128, block_n=128, block_k=64, max_concurrent_steps=3,
                    out_dtype="float32", gather="fused")
  f = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=cfg, interpret=True),
                                        dw2(dout, ap, plan, config=cfg, interpret=True)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  assert g1.dtype == g2.dtype == jnp.float32
  w1 = XLA.dw1(a["x"], a["dh"], plan)
  w2 = XLA.dw2(a["dout"], a["a_prime"], plan)
  assert _rel(g1, w1) < F32_TOL and _rel(g2, w2) < F32_TOL


def test_wgrad_fused_gather_validation():
  a = _inputs("straddle_e5")
  plan = a["plan"]
  with pytest.raises(ValueError, match="WgradConfig.gather must be 'xla' or 'fused'"):
    WgradConfig(gather="tma")
  with pytest.raises(ValueError, match="WgradConfig.max_concurrent_steps must be >= 2"):
    WgradConfig(max_concurrent_steps=1, gather="fused")
  with pytest.raises(ValueError, match="WgradConfig.block_k must be a multiple of 64"):
    WgradConfig(block_k=32)
  with pytest.raises(ValueError, match="WgradConfig.num_compute_wgs must be 1 or 2"):
    WgradConfig(num_compute_wgs=3, gather="fused")
  with pytest.raises(ValueError, match="WgradConfig.max_concurrent_steps must be >= 2"):
    WgradConfig(num_compute_wgs=2, max_concurrent_steps=1)  # the ring kernel, gather="xla"
  assert WgradConfig(num_compute_wgs=2).ring and not WgradConfig().ring
  two = WgradConfig(block_m=64, block_n=64, max_concurrent_steps=2, gather="fused",
                    num_compute_wgs=2)
  with pytest.raises(ValueError, match=r"WgradConfig.block_n \(64\) must be a multiple of 128 "
                                       r"with num_compute_wgs = 2"):
    dw1(a["x"], a["dh"], plan, config=two, interpret=True)
  with pytest.raises(ValueError, match="x_gathered must be None"):
    dw1(a["x"], a["dh"], plan, config=WG_FUSED_CFG, interpret=True,
        x_gathered=a["x"][plan.gather_idx])
  with pytest.raises(ValueError, match="dout_gathered must be None"):
    dw2(a["dout"], a["a_prime"], plan, config=WG_FUSED_CFG, interpret=True,
        dout_gathered=a["dout"][plan.gather_idx])
  with pytest.raises(ValueError, match="grouped_outer takes gathered operands"):
    wgrad_lib.grouped_outer(a["x"][plan.gather_idx], a["dh"], plan, config=WG_FUSED_CFG,
                            interpret=True)
  # A 192-column gathered tile (384 bytes) does not divide the producer's 2048-byte pass.
  wide = WgradConfig(block_m=192, block_n=64, max_concurrent_steps=2, gather="fused")
  x192 = jnp.zeros((a["x"].shape[0], 192), a["x"].dtype)
  with pytest.raises(ValueError, match=r"WgradConfig.block_m \(192\) with gather='fused'"):
    dw1(x192, a["dh"], plan, config=wide, interpret=True)
  with pytest.raises(ValueError, match="dh must have shape"):
    dw1(a["x"], a["dh"][1:], plan, config=WG_FUSED_CFG, interpret=True)
  with pytest.raises(ValueError, match="must share a dtype"):
    dw2(a["dout"], a["a_prime"].astype(jnp.float16), plan, config=WG_FUSED_CFG, interpret=True)
  deep = WgradConfig(max_concurrent_steps=6, gather="fused")  # 6 x 32 KiB ring + 32 KiB tile
  assert wgrad_lib.smem_bytes(deep) > wgrad_lib.SMEM_LIMIT
  with pytest.raises(ValueError, match="bytes of SMEM"):
    dw1(jnp.zeros((a["x"].shape[0], 128), a["x"].dtype), a["dh"], plan, config=deep,
        interpret=True)


def test_wgrad_config_for_fused_gather():
  """Same tiles as the XLA-gather default, the deepest ring (<= 5) that fits SMEM."""
  for m, n in ((4096, 2048), (1024, 4096), (768, 192), (256, 64)):
    base = wgrad_config_for(m, n)
    cfg = wgrad_config_for(m, n, gather="fused")
    assert base.gather == "xla" and cfg.gather == "fused"
    assert (cfg.block_m, cfg.block_n, cfg.block_k) == (base.block_m, base.block_n, base.block_k)
    assert wgrad_lib.smem_bytes(cfg) <= wgrad_lib.SMEM_LIMIT
    deeper = dataclasses.replace(cfg, max_concurrent_steps=cfg.max_concurrent_steps + 1)
    assert cfg.max_concurrent_steps == 5 or wgrad_lib.smem_bytes(deeper) > wgrad_lib.SMEM_LIMIT
  assert wgrad_config_for(4096, 2048, gather="fused").max_concurrent_steps == 5


_WG2_DW1 = WgradConfig(block_m=128, block_n=256, max_concurrent_steps=3, gather="fused",
                       num_compute_wgs=2, num_sms=132)
_WG2_DW2 = WgradConfig(block_m=256, block_n=128, max_concurrent_steps=3, gather="fused",
                       num_compute_wgs=2, num_sms=132)


@pytest.mark.parametrize("cfg1,cfg2", [
    (WgradConfig(max_concurrent_steps=5, grid_block_n=4, gather="fused", num_sms=132),) * 2,
    (WgradConfig(block_m=64, block_n=64, max_concurrent_steps=3, gather="fused",
                 num_sms=132),) * 2,
    (WgradConfig(block_k=128, max_concurrent_steps=2, out_dtype="float32", gather="fused",
                 num_sms=132),) * 2,
    (_WG2_DW1, _WG2_DW2),
], ids=["128x128x64", "64x64x64", "128x128x128-f32", "2wg"])
def test_wgrad_fused_gather_lowers_to_mosaic_gpu(cfg1, cfg2):
  """Lowers the fused-gather dw1 and dw2 for CUDA on the CPU host: layout inference of the
  transposed-lhs wgmma on a cp.async-filled tiled ring (dw1), the gathered rhs (dw2), the
  boundary masks, two consumer warpgroups, and the inline cp.async (zero-filling) / mbarrier
  code."""
  a = _inputs("straddle_e5", d=256, n=128)
  plan = a["plan"]
  f = lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=cfg1), dw2(dout, ap, plan, config=cfg2))
  text = jax.jit(f).trace(a["x"], a["dout"], a["dh"], a["dh"]).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  for op in ("cp.async.shared.global", "cp.async.mbarrier.arrive", "mbarrier.try_wait.parity"):
    assert op in text, op


def test_wgrad_fused_gather_two_consumers():
  """num_compute_wgs=2: the consumers split the plain operand's columns (dH's for dW1, A''s for
  dW2) and share the gathered tile."""
  a = _inputs("straddle_e5", d=256, n=128)
  plan = a["plan"]
  c1 = dataclasses.replace(_WG2_DW1, block_m=64, block_n=128, num_sms=None)
  c2 = dataclasses.replace(_WG2_DW2, block_m=128, block_n=64, num_sms=None)
  f = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=c1, interpret=True),
                                        dw2(dout, ap, plan, config=c2, interpret=True)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  _assert_wgrad_matches(g1, g2, plan, XLA.dw1(a["x"], a["dh"], plan),
                        XLA.dw2(a["dout"], a["a_prime"], plan))


_WG2_XLA_DW1 = dataclasses.replace(_WG2_DW1, gather="xla")
_WG2_XLA_DW2 = dataclasses.replace(_WG2_DW2, gather="xla")


@pytest.mark.parametrize("case", sorted(CASES))
def test_wgrad_two_consumers_xla_gather_matches_xla(case):
  """num_compute_wgs=2 with gather="xla": the ring kernel with both operands by TMA (the
  pre-gathered side shared by the consumers, masked once by the first). Empty experts, a 1-row
  expert, groups straddling K blocks, every token on one expert; NaN in the padding rows of dH /
  A' and of the pre-gathered operands never reaches a gradient."""
  a = _inputs(case, d=256, n=128)
  plan = a["plan"]
  c1 = dataclasses.replace(_WG2_XLA_DW1, block_m=64, block_n=128, num_sms=None)
  c2 = dataclasses.replace(_WG2_XLA_DW2, block_m=128, block_n=64, num_sms=None)
  rows = np.arange(plan.capacity)
  offs = np.asarray(plan.group_offsets)
  outside = jnp.asarray(~((rows[:, None] >= offs[:-1]) & (rows[:, None] < offs[1:])).any(1))
  poison = lambda g: jnp.where(outside[:, None], jnp.nan, g).astype(g.dtype)
  xg, dog = poison(a["x"][plan.gather_idx]), poison(a["dout"][plan.gather_idx])
  f = jax.jit(lambda x, dout, dh_, ap: (
      dw1(x, dh_, plan, config=c1, interpret=True, x_gathered=xg),
      dw2(dout, ap, plan, config=c2, interpret=True, dout_gathered=dog)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  assert np.isfinite(np.asarray(g1, np.float32)).all()
  assert np.isfinite(np.asarray(g2, np.float32)).all()
  _assert_wgrad_matches(g1, g2, plan, XLA.dw1(a["x"], a["dh"], plan),
                        XLA.dw2(a["dout"], a["a_prime"], plan))


@pytest.mark.parametrize("gather", ["xla", "fused"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_wgrad_cluster_pairs_match_xla(case, gather):
  """WgradConfig(cluster_m=2) on the ring kernel in the interpreter: the cluster grid and the
  tile pairs along the gathered side's dim (M for dW1, N for dW2), each CTA its tile of the pair
  (the interpreter has no cluster barriers: each loads its own plain tile)."""
  a = _inputs(case, d=256, n=128)
  plan = a["plan"]
  base1, base2 = (_WG2_XLA_DW1, _WG2_XLA_DW2) if gather == "xla" else (_WG2_DW1, _WG2_DW2)
  c1 = dataclasses.replace(base1, block_m=64, block_n=128, num_sms=None, cluster_m=2)
  c2 = dataclasses.replace(base2, block_m=128, block_n=64, num_sms=None, cluster_m=2)
  f = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=c1, interpret=True),
                                        dw2(dout, ap, plan, config=c2, interpret=True)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  _assert_wgrad_matches(g1, g2, plan, XLA.dw1(a["x"], a["dh"], plan),
                        XLA.dw2(a["dout"], a["a_prime"], plan))


def test_wgrad_cluster_validation():
  with pytest.raises(ValueError, match="cluster_m must be 1 or 2"):
    WgradConfig(num_compute_wgs=2, cluster_m=3)
  with pytest.raises(ValueError, match="cluster_m = 2 needs the ring kernel"):
    WgradConfig(cluster_m=2)
  cfg = WgradConfig(block_m=128, block_n=256, num_compute_wgs=2, max_concurrent_steps=3,
                    cluster_m=2)
  with pytest.raises(ValueError, match=r"x.shape\[1\] / block_m \(3\) must be even"):
    wgrad_lib.validate_wgrad_shapes(384, 256, cfg, names=("x", "dh"), gathered="lhs")
  wgrad_lib.validate_wgrad_shapes(512, 256, cfg, names=("x", "dh"), gathered="lhs")
  assert WgradConfig().cluster_m == 1  # not yet run on a GPU


@pytest.mark.parametrize("gather", ["xla", "fused"])
def test_wgrad_cluster_lowers_to_mosaic_gpu(gather):
  """cluster_m=2 on the ring kernel lowers for CUDA on the CPU host (the plain tile by TMA
  multicast, the ClusterBarrier release)."""
  a = _inputs("straddle_e5", d=256, n=128)
  plan = a["plan"]
  base1, base2 = (_WG2_XLA_DW1, _WG2_XLA_DW2) if gather == "xla" else (_WG2_DW1, _WG2_DW2)
  c1 = dataclasses.replace(base1, cluster_m=2)
  c2 = dataclasses.replace(base2, block_m=128, cluster_m=2)
  f = lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=c1), dw2(dout, ap, plan, config=c2))
  text = jax.jit(f).trace(a["x"], a["dout"], a["dh"], a["dh"]).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def test_wgrad_two_consumers_xla_gather_lowers_to_mosaic_gpu():
  """The TMA-only ring (gather="xla", two consumers) lowers for CUDA on the CPU host: layout
  inference of the TMA-filled shared tile, its boundary mask and the consumers' meeting."""
  a = _inputs("straddle_e5", d=256, n=128)
  plan = a["plan"]
  f = lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=_WG2_XLA_DW1),
                                dw2(dout, ap, plan, config=_WG2_XLA_DW2))
  text = jax.jit(f).trace(a["x"], a["dout"], a["dh"], a["dh"]).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("case", sorted(CASES))
def test_wgrad_ring_block_meta(case):
  """The ring kernel's K blocks (_block_meta(aligned=False)): each expert's first block starts at
  its first row rounded down to 8 (the TMA's row alignment), the blocks cover its rows with no
  block to spare, empty experts get none, and the fifth row is the count of valid rows."""
  plan = _inputs(case)["plan"]
  bk = 64
  starts, ends, bstarts, nblocks, valid = np.asarray(wgrad_lib._block_meta(plan, bk,
                                                                            aligned=False))
  offs = np.asarray(plan.group_offsets)
  np.testing.assert_array_equal(starts, offs[:-1])
  np.testing.assert_array_equal(ends, offs[1:])
  assert (bstarts % 8 == 0).all() and (bstarts <= starts).all() and (starts - bstarts < 8).all()
  live = ends > starts
  assert (nblocks[~live] == 0).all()
  span = ends - bstarts
  assert ((nblocks * bk >= span) & ((nblocks - 1) * bk < span))[live].all()
  assert (valid == offs[-1]).all()
  # Never more steps than the block_k-aligned layout of the one-consumer kernel.
  aligned = np.asarray(wgrad_lib._block_meta(plan, bk))
  assert (nblocks <= aligned[3]).all()


def test_wgrad_float32_output():
  a = _inputs("straddle_e5")
  plan = a["plan"]
  cfg = WgradConfig(block_m=64, block_n=64, block_k=64, out_dtype="float32")
  got = jax.jit(lambda x, dh_: dw1(x, dh_, plan, config=cfg, interpret=True))(a["x"], a["dh"])
  assert got.dtype == jnp.float32
  assert _rel(got, XLA.dw1(a["x"], a["dh"], plan)) < F32_TOL


def test_validation_errors():
  a = _inputs("straddle_e5")
  plan = a["plan"]
  s = plan.grouped_scores()
  with pytest.raises(ValueError, match="h must have shape"):
    dh(a["dout"], a["w2"], a["h"][:, :64], s, plan, config=DH_CFG, interpret=True)
  with pytest.raises(ValueError, match="multiple of DhConfig.block_n"):
    dh(a["dout"], a["w2"], a["h"], s, plan, config=DhConfig(block_n=256), interpret=True)
  with pytest.raises(ValueError, match="bfloat16 or float16"):
    dh(a["dout"].astype(jnp.float32), a["w2"], a["h"], s, plan, config=DH_CFG, interpret=True)
  with pytest.raises(ValueError, match="scores_grouped"):
    dh(a["dout"], a["w2"], a["h"], s[:-1], plan, config=DH_CFG, interpret=True)
  with pytest.raises(ValueError, match="block_m"):
    dw1(a["x"], a["dh"], plan, config=WgradConfig(block_m=256), interpret=True)
  with pytest.raises(ValueError, match="share a dtype"):
    dw2(a["dout"], a["a_prime"].astype(jnp.float16), plan, config=WG_CFG, interpret=True)
  with pytest.raises(ValueError, match="block_m"):
    dw2(a["dout"], a["a_prime"][:, :96], plan, config=WG_CFG, interpret=True)
  with pytest.raises(ValueError, match="x must have shape"):
    dw1(a["x"][1:], a["dh"], plan, config=WG_CFG, interpret=True)
  with pytest.raises(ValueError, match="multiple of 64"):
    DhConfig(block_m=32)
  with pytest.raises(ValueError, match="epi_n"):
    DhConfig(epi_n=32)
  # The H tiles stay in SMEM over the K loop: 64 KiB + a 4 x 64 KiB ring does not fit.
  with pytest.raises(ValueError, match="bytes of SMEM"):
    dh(a["dout"], a["w2"], a["h"], s, plan, config=DhConfig(block_n=128, block_k=128),
       interpret=True)


def test_backend_validate_runs_backward_checks():
  """PallasKernels.validate rejects shapes the forward tiles but dh / dw cannot (d or n not a
  multiple of 64), naming the argument and the rule, before any kernel runs."""
  import sonic_jax
  from sonic_jax.pallas.backend import PallasKernels

  calls = []

  class Recording(PallasKernels):
    def up_proj(self, *args, **kwargs):
      calls.append("up_proj")
      return super().up_proj(*args, **kwargs)

  kern = Recording(interpret=True)
  sizes, t, k = [0, 70, 1, 40, 17], 64, 2
  plan = make_plan(sizes, t, k)
  e = len(sizes)

  def arrays(d, n):
    keys = jax.random.split(jax.random.key(5), 4)
    bf = jnp.bfloat16
    return (jax.random.normal(keys[0], (t, d), bf),
            (jax.random.normal(keys[1], (d, e)) / np.sqrt(d)).astype(bf),
            (jax.random.normal(keys[2], (e, d, 2 * n)) / np.sqrt(d)).astype(bf),
            (jax.random.normal(keys[3], (e, n, d)) / np.sqrt(n)).astype(bf))

  x, _, w1, w2 = arrays(128, 64)
  kern.validate(x, plan, w1, w2)  # d, n multiples of 64: accepted
  rules = {
      (96, 64): r"x.shape\[1\] \(d = 96\).*backward kernel dh.*d \(96\) must be a multiple "
                r"of DhConfig.block_k \(64\)",
      (64, 96): r"w2.shape\[1\] \(n = 96\).*backward kernel dh.*n \(96\) must be a multiple "
                r"of DhConfig.block_n \(64\)",
  }
  for (d, n), rule in rules.items():
    x, router_w, w1, w2 = arrays(d, n)
    kern.validate(x, plan, w1, w2, backward=False)  # the forward alone tiles these shapes
    with pytest.raises(ValueError, match=rule):
      kern.validate(x, plan, w1, w2)
    # The rule validate reports is the one the kernel itself enforces.
    with pytest.raises(ValueError, match="must be a multiple of DhConfig.block_"):
      dh(x, w2, jnp.zeros((plan.capacity, 2 * n), x.dtype), plan.grouped_scores(), plan,
         interpret=True)
    # Through the layer: fails while tracing the forward, before any kernel runs.
    loss = lambda x, w1, w2: jnp.sum(sonic_jax.moe(x, router_w, w1, w2, top_k=k, backend=kern)
                                     .astype(jnp.float32))
    with pytest.raises(ValueError, match=rule):
      jax.grad(loss, argnums=(0, 1, 2))(x, w1, w2)
  assert calls == [], "a kernel ran before the shape was rejected"


@pytest.mark.parametrize("kernel", ["dh", "wgrad"])
def test_kernels_lower_to_mosaic_gpu(kernel):
  """Lowers the real (non-interpret) kernels for CUDA on the CPU host.

  The interpreter does not check layouts; this runs Mosaic GPU's layout inference and MLIR
  lowering, which caught unaligned TMA starts and ragged-store slicing bugs before a GPU run.
  """
  a = _inputs("straddle_e5")
  plan = a["plan"]
  if kernel == "dh":
    f = lambda *args: dh(*args, config=DhConfig(block_n=64, num_sms=132))
    args = (a["dout"], a["w2"], a["h"], plan.grouped_scores(), plan)
  else:
    f = lambda u, v, p: (dw1(u, v, p, config=WgradConfig(num_sms=132)),
                         dw2(u, v[:, :64], p, config=WgradConfig(block_m=64, num_sms=132)))
    args = (a["x"], a["dh"], plan)
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def _pallas_backend_complete():
  """(PallasKernels instance, None) when the forward helper's wiring is in place, else why not."""
  try:
    from sonic_jax.pallas.backend import PallasKernels
    return PallasKernels(interpret=True), None
  except TypeError as e:  # abstract methods still missing
    return None, f"sonic_jax.pallas.backend.PallasKernels is incomplete: {e}"
  except ImportError as e:
    return None, f"the Pallas backend does not import: {e}"


@pytest.mark.parametrize("gathers", ["xla", "fused", "fused-x", "dispatch"])
def test_moe_gradients_pallas_interpret_vs_xla(gathers):
  """The layer's gradients through the Pallas kernels; "fused": dh, dw1 and dw2 gather their dO
  / x rows in the kernel (configs passed through ForwardConfig)."""
  import sonic_jax
  kernels, why = _pallas_backend_complete()
  if kernels is None:
    pytest.skip(why)
  t, d, n, e, k = 64, 128, 64, 5, 2
  if gathers == "fused":
    from sonic_jax.pallas.backend import PallasKernels
    from sonic_jax.pallas.configs import ForwardConfig
    kernels = PallasKernels(interpret=True, config=ForwardConfig(
        dh=dataclasses.replace(DH_FUSED_CFG, block_n=64), dw1=WG_FUSED_CFG, dw2=WG_FUSED_CFG))
  elif gathers == "fused-x":
    from sonic_jax.pallas.backend import PallasKernels
    from sonic_jax.pallas.configs import ForwardConfig
    kernels = PallasKernels(interpret=True, backward_gathers="fused-x",
                            config=ForwardConfig(dw1=WG_FUSED_CFG))
    assert kernels._dh_config(128, 64).gather == "xla"
  elif gathers == "dispatch":  # dO and x rows by the Pallas-Triton dispatch kernel
    from sonic_jax.pallas.backend import PallasKernels
    kernels = PallasKernels(interpret=True, backward_gathers="xla", row_gather="pallas_triton")
  keys = jax.random.split(jax.random.key(3), 5)
  bf = jnp.bfloat16
  x = jax.random.normal(keys[0], (t, d), bf)
  router_w = (jax.random.normal(keys[1], (d, e)) / np.sqrt(d)).astype(bf)
  w1 = (jax.random.normal(keys[2], (e, d, 2 * n)) / np.sqrt(d)).astype(bf)
  w2 = (jax.random.normal(keys[3], (e, n, d)) / np.sqrt(n)).astype(bf)
  ct = jax.random.normal(keys[4], (t, d), jnp.float32)

  def loss(backend):
    def f(x, router_w, w1, w2):
      y = sonic_jax.moe(x, router_w, w1, w2, top_k=k, backend=backend)
      return jnp.sum(y.astype(jnp.float32) * ct)
    return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))

  got = loss(kernels)(x, router_w, w1, w2)
  want = loss("xla")(x, router_w, w1, w2)
  for name, g, w in zip(("dx", "drouter_w", "dw1", "dw2"), got, want):
    assert _rel(g, w) < 2e-2, name
  if gathers == "dispatch":  # the same rows as XLA's gather: the same gradients, bit for bit
    from sonic_jax.pallas.backend import PallasKernels
    base = loss(PallasKernels(interpret=True, backward_gathers="xla"))(x, router_w, w1, w2)
    for name, g, b in zip(("dx", "drouter_w", "dw1", "dw2"), got, base):
      np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(b, np.float32), name)


def test_up_proj_xla_gather_takes_rows_from_row_gather():
  """An up_proj config with gather="xla" takes its x rows from row_gather (here the
  Pallas-Triton dispatch in interpret mode): H and A bit for bit those of XLA's gather."""
  from sonic_jax.pallas.backend import PallasKernels
  from sonic_jax.pallas.configs import ForwardConfig, GemmConfig
  a = _gpu_inputs(t=64, d=128, n=64, e=5, k=2)
  w1 = (jax.random.normal(jax.random.key(4), (5, 128, 128)) / 12).astype(jnp.bfloat16)
  cfg = ForwardConfig(up_proj=GemmConfig(block_n=64, gather="xla"))
  outs = [PallasKernels(interpret=True, config=cfg, row_gather=rg).up_proj(a["x"], w1, a["plan"])
          for rg in ("xla", "pallas_triton")]
  for name, got, want in zip(("H", "A"), outs[1], outs[0]):
    m = np.asarray(a["plan"].valid_mask())
    np.testing.assert_array_equal(np.asarray(got, np.float32)[m], np.asarray(want, np.float32)[m],
                                  name)


def test_row_gather_validation():
  from sonic_jax.pallas.backend import PallasKernels
  with pytest.raises(ValueError, match="row_gather must be one of"):
    PallasKernels(row_gather="cub")
  with pytest.raises(ValueError, match="row_gather='jax_triton' has no CPU interpreter"):
    PallasKernels(interpret=True, row_gather="jax_triton")
  assert PallasKernels(row_gather="jax_triton") != PallasKernels()
  assert PallasKernels(row_gather="jax_triton") == PallasKernels(row_gather="jax_triton")
  assert PallasKernels().row_gather == "auto"
  # "auto" in interpret mode: XLA's gather (the jitted backward has no Triton call).
  a = _gpu_inputs(t=64, d=128, n=64, e=4, k=2)
  kern = PallasKernels(interpret=True)
  assert kern._gathered(a["dout"], a["plan"], fused=False) is None
  assert PallasKernels(interpret=True, row_gather="pallas_triton")._gathered(
      a["dout"], a["plan"], fused=True) is None


# ---------------------------------------------------------------------------------------------
# GPU (lowered kernels) at real sizes.


def _gpu_inputs(t=4096, d=1024, n=512, e=12, k=4, seed=0):
  keys = jax.random.split(jax.random.key(seed), 7)
  logits = jax.random.normal(keys[0], (t, e))
  from sonic_jax.routing import route_logits
  plan = route_logits(logits, top_k=k)
  p = plan.capacity
  bf = jnp.bfloat16
  return dict(
      plan=plan,
      x=jax.random.normal(keys[1], (t, d), bf),
      dout=jax.random.normal(keys[2], (t, d), bf),
      w2=(jax.random.normal(keys[3], (e, n, d)) / np.sqrt(d)).astype(bf),
      h=jax.random.normal(keys[4], (p, 2 * n), bf),
      dh=jax.random.normal(keys[5], (p, 2 * n), bf),
      a_prime=jax.random.normal(keys[6], (p, n), bf),
  )


def _check_gpu_dh(a, cfg: DhConfig | None = None) -> None:
  """dh with ``cfg`` (None: dh_config_for's) on ``_gpu_inputs`` against the xla backend, dH, A'
  and dS separately by relative error, then the same bits from a second call."""
  plan = a["plan"]
  args = (a["dout"], a["w2"], a["h"], plan.grouped_scores(), plan)
  f = jax.jit(lambda *args: dh(*args, config=cfg))
  got = f(*args)
  want = XLA.dh(*args)
  for name, g, w, tol in zip(("dH", "A'", "dS"), got, want, (BF16_TOL, BF16_TOL, 1e-4)):
    assert _rel(g, w) < tol, name
  for g, g2 in zip(got, f(*args)):
    assert np.array_equal(np.asarray(g), np.asarray(g2)), "not deterministic"


@pytest.mark.gpu
def test_gpu_dh_matches_xla():
  _check_gpu_dh(_gpu_inputs())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fused", "ring", "fused-2wg", "ring-2wg", "ring-wide",
                                  "ring-wide-k32", "fused-wide", "ring-wide-prefetch",
                                  "ring-rows-wide", "ring-rows-wide-prefetch", "fused-rows-wide",
                                  "ring-rows-wide-cluster2", "fused-rows-wide-cluster2"])
def test_gpu_dh_fused_gather_matches_default(kind):
  """The ring kernel, DhConfig(gather="fused") or DhConfig(ring=True) (the heuristic's tiles, 3
  stages), against the default XLA-gather kernel and the xla backend at a realistic size; the
  same k order (the default's 64-column tiles at this d only change which N tiles dS's partials
  are summed over), so it should match the default to fp32 rounding; deterministic."""
  a = _gpu_inputs()
  plan = a["plan"]
  s = plan.grouped_scores()
  d, n = a["dout"].shape[1], a["w2"].shape[1]
  cfg = dh_config_for(d, n, gather="fused")
  if kind.startswith("ring"):
    cfg = dataclasses.replace(cfg, gather="xla", ring=True)
  if kind.endswith("-2wg"):
    cfg = dataclasses.replace(cfg, num_consumers=2)
  if "-rows-wide" in kind:
    cfg = dataclasses.replace(cfg, **WIDE_M_DH)
  elif "-wide" in kind:
    cfg = dataclasses.replace(cfg, **WIDE_DH)
  if kind.endswith("-prefetch"):
    cfg = dataclasses.replace(cfg, h_prefetch=True)
  if kind.endswith("-k32"):
    cfg = dataclasses.replace(cfg, block_k=32, max_concurrent_steps=6)
  if kind.endswith("-cluster2"):  # 2-CTA clusters, W2 by TMA multicast (DhConfig.cluster_m)
    cfg = dataclasses.replace(cfg, cluster_m=2)
  fused = jax.jit(lambda *args: dh(*args, config=cfg))
  got = fused(a["dout"], a["w2"], a["h"], s, plan)
  base = jax.jit(lambda *args: dh(*args))(a["dout"], a["w2"], a["h"], s, plan)
  want = XLA.dh(a["dout"], a["w2"], a["h"], s, plan)
  for name, g, b, w, tol in zip(("dH", "A'", "dS"), got, base, want, (BF16_TOL, BF16_TOL, 1e-4)):
    assert _rel(g, w) < tol, f"{name} vs xla"
    assert _rel(g, b) < min(tol, 1e-3), f"{name} vs the default kernel"
  again = fused(a["dout"], a["w2"], a["h"], s, plan)
  for g, g2 in zip(got, again):
    assert np.array_equal(np.asarray(g), np.asarray(g2)), "not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("d", [768, 1536])
def test_gpu_dh_fused_default_at_small_d_matches_xla(d):
  """dh_config_for(gather="fused") at n = 256 and d < 4096 (the row-split 128 x 256 tile since
  session 12) against the xla backend, with dH, A' and dS separately; deterministic."""
  cfg = dh_config_for(d, 256, gather="fused")
  assert (cfg.gather, cfg.num_consumers, cfg.consumer_split, cfg.block_n) == ("fused", 2, "m", 256)
  _check_gpu_dh(_gpu_inputs(t=4096, d=d, n=256, e=24, k=8, seed=3), cfg)


# The swizzled staging (DhConfig.epilogue_swizzle) on the tiles a short K loop might run: the
# row-split 128 x 256 ring tile with H from HBM (dO gathered by XLA or in the kernel), the
# row-split 128 x 128 ring tile with H prefetched into SMEM, the two-CTA one-warpgroup kernel.
SWZ_DH = {
    "ring-rows-256-gmem": dict(ring=True, **WIDE_M_DH),
    "fused-rows-256-gmem": dict(gather="fused", **WIDE_M_DH),
    "ring-rows-128-smem": dict(ring=True, **{**WIDE_M_DH, "block_n": 128, "h_source": "smem"}),
    # dh_config_for's kernel at d <= 1536 (one warpgroup, 64-column tiles, two CTAs per SM).
    "two-ctas-64": dict(block_n=64, epi_n=64, max_concurrent_steps=3, ctas_per_sm=2),
    # The 128 x 256 row-split default at d >= 1536 with the H loads issued a chunk ahead.
    "ring-rows-256-gmem-lookahead": dict(ring=True, **WIDE_M_DH, h_lookahead=True),
    # Two consumers per CTA with their own rings (DhConfig.pipelines, opt-in), 64 x 256 tiles.
    "ring-2pipes-64x256": dict(ring=True, pipelines=2, **{**WIDE_M_DH, "block_m": 64,
                                                         "num_consumers": 1,
                                                         "max_concurrent_steps": 4}),
    # ... on one shared ring, the consumers ordered by turn barriers (session 32; d = 768 /
    # block_k 32 = 24 k steps, a multiple of 2 x 4), dO gathered by XLA or in the kernel.
    "ring-2pipes-64x256-shared": dict(ring=True, pipelines=2, pipeline_ring="shared",
                                      **{**WIDE_M_DH, "block_m": 64, "num_consumers": 1,
                                         "max_concurrent_steps": 4}),
    "fused-2pipes-64x256-shared": dict(gather="fused", pipelines=2, pipeline_ring="shared",
                                       **{**WIDE_M_DH, "block_m": 64, "num_consumers": 1,
                                          "max_concurrent_steps": 4}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", [True, False])
@pytest.mark.parametrize("kind", sorted(SWZ_DH))
def test_gpu_dh_swizzled_epilogue_matches_xla(kind, swizzle):
  """dh with and without the swizzled epilogue at d = 768, n = 512 (groups straddle
  the 64-row windows, so both the one-TMA and the ladder stores run) against the xla backend:
  dH, A' and dS separately; deterministic."""
  _check_gpu_dh(_gpu_inputs(t=4096, d=768, n=512, e=24, k=8, seed=5),
                DhConfig(**SWZ_DH[kind], epilogue_swizzle=swizzle))


@pytest.mark.gpu
def test_gpu_dw1_dw2_match_xla():
  a = _gpu_inputs()
  plan = a["plan"]
  f = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan), dw2(dout, ap, plan)))
  g1, g2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  assert _rel(g1, XLA.dw1(a["x"], a["dh"], plan)) < BF16_TOL, "dW1"
  assert _rel(g2, XLA.dw2(a["dout"], a["a_prime"], plan)) < BF16_TOL, "dW2"
  h1, h2 = f(a["x"], a["dout"], a["dh"], a["a_prime"])
  assert np.array_equal(np.asarray(g1), np.asarray(h1)), "dW1 not deterministic"
  assert np.array_equal(np.asarray(g2), np.asarray(h2)), "dW2 not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("wgs", [1, 2, "xla-ring", "2-cluster2", "xla-ring-cluster2"])
def test_gpu_wgrad_fused_gather_matches_default(wgs):
  """WgradConfig(gather="fused") (1: the heuristic's tiles and ring; 2: two consumer warpgroups
  on 128x256 / 256x128 tiles; "xla-ring": those two consumers on XLA-gathered operands by TMA)
  against the default XLA-gather kernel and the xla backend at a realistic size; same K order,
  so it matches the default to fp32 rounding; deterministic."""
  a = _gpu_inputs()
  plan = a["plan"]
  d, n = a["x"].shape[1], a["a_prime"].shape[1]
  # "-cluster2": 2-CTA clusters sharing the plain tile by TMA multicast (cluster_m).
  cluster = dict(cluster_m=2) if str(wgs).endswith("-cluster2") else {}
  if wgs == 1:
    c1 = wgrad_config_for(d, 2 * n, gather="fused")
    c2 = wgrad_config_for(n, d, gather="fused")
  elif str(wgs).startswith("2"):
    c1 = dataclasses.replace(_WG2_DW1, num_sms=None, **cluster)
    c2 = dataclasses.replace(_WG2_DW2, num_sms=None, **cluster)
  else:
    c1 = dataclasses.replace(_WG2_XLA_DW1, num_sms=None, **cluster)
    c2 = dataclasses.replace(_WG2_XLA_DW2, num_sms=None, **cluster)
  fused = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan, config=c1),
                                            dw2(dout, ap, plan, config=c2)))
  base = jax.jit(lambda x, dout, dh_, ap: (dw1(x, dh_, plan), dw2(dout, ap, plan)))
  args = (a["x"], a["dout"], a["dh"], a["a_prime"])
  got, ref = fused(*args), base(*args)
  want = (XLA.dw1(a["x"], a["dh"], plan), XLA.dw2(a["dout"], a["a_prime"], plan))
  for name, g, b, w in zip(("dW1", "dW2"), got, ref, want):
    assert _rel(g, w) < BF16_TOL, f"{name} vs xla"
    assert _rel(g, b) < 1e-3, f"{name} vs the default kernel"
  again = fused(*args)
  for g, g2 in zip(got, again):
    assert np.array_equal(np.asarray(g), np.asarray(g2)), "not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 1024, 512, 12, 4), (4096, 1024, 256, 16, 8),
                                   (2048, 4096, 1024, 8, 2)])
def test_gpu_layer_gradients_match_float32_reference(shape):
  """The layer's gradients with every default Pallas tiling (n = 512: XLA gathers feeding the
  two-consumer dW rings; n = 256: fused gathers; d = 4096: dh on the wide 128 x 256 tile with
  H read from HBM) against the xla backend on float32 inputs."""
  import sonic_jax
  t, d, n, e, k = shape
  keys = jax.random.split(jax.random.key(11), 5)
  x = jax.random.normal(keys[0], (t, d), jnp.float32)
  router_w = jax.random.normal(keys[1], (d, e)) / np.sqrt(d)
  w1 = jax.random.normal(keys[2], (e, d, 2 * n)) / np.sqrt(d)
  w2 = jax.random.normal(keys[3], (e, n, d)) / np.sqrt(n)
  ct = jax.random.normal(keys[4], (t, d), jnp.float32)
  # Both sides see the same bf16-rounded values, so routing cannot flip on rounding.
  x, router_w, w1, w2 = (a.astype(jnp.bfloat16).astype(jnp.float32)
                         for a in (x, router_w, w1, w2))

  def grads(backend, dtype):
    def f(*args):
      y = sonic_jax.moe(*args, top_k=k, backend=backend)
      return jnp.sum(y.astype(jnp.float32) * ct)
    args = [a.astype(dtype) for a in (x, router_w, w1, w2)]
    return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(*args)

  got = grads("pallas", jnp.bfloat16)
  want = grads("xla", jnp.float32)
  for name, g, w in zip(("dx", "drouter_w", "dw1", "dw2"), got, want):
    assert np.all(np.isfinite(np.asarray(g, np.float32))), name
    assert _rel(g, w) < 2e-2, name
  # The default's pre-gathered rows come from the Triton dispatch kernel (row_gather="auto");
  # XLA's gather gives the same rows, so the same gradients bit for bit.
  from sonic_jax.pallas.backend import PallasKernels
  again = grads(PallasKernels(row_gather="xla"), jnp.bfloat16)
  for name, g, a in zip(("dx", "drouter_w", "dw1", "dw2"), got, again):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(a, np.float32),
                                  f"{name}: row_gather auto vs xla")


def test_backward_gathers_modes_pick_the_fused_configs():
  """PallasKernels(backward_gathers=...): "auto" fuses the backward's gathers where the H200
  measured it faster (n <= 512 with the two-consumer dW tiling), "xla" / "fused" force a mode,
  ForwardConfig entries win, and a bad mode is rejected."""
  from sonic_jax.pallas.backend import PallasKernels
  from sonic_jax.pallas.configs import ForwardConfig
  auto = PallasKernels()
  for d, n, mode in ((4096, 256, "fused"), (768, 256, "fused"), (4096, 512, "fused"),
                     (1536, 512, "xla"), (4096, 1024, "xla"), (768, 128, "xla"),
                     (4096, 2048, "xla")):
    assert auto._bwd_gather(d, n) == mode, (d, n)
    assert auto._dh_config(d, n).gather == mode
    assert auto._dw1_config(d, 2 * n).gather == mode
    assert auto._dw2_config(n, d).gather == mode
  c1, c2 = auto._dw1_config(4096, 512), auto._dw2_config(256, 4096)
  assert (c1.block_m, c1.block_n, c1.num_compute_wgs) == (128, 256, 2)
  assert (c2.block_m, c2.block_n, c2.num_compute_wgs) == (256, 128, 2)
  fused = PallasKernels(backward_gathers="fused")
  assert fused._dh_config(4096, 1024).gather == "fused"
  assert fused._dw1_config(4096, 2048).num_compute_wgs == 2
  # n = 192: no two-consumer split; the single-consumer fused tiling still tiles it.
  assert fused._dw2_config(192, 768).num_compute_wgs == 1
  assert PallasKernels(backward_gathers="xla")._dw1_config(4096, 512).gather == "xla"
  # "fused-x": only dW1 gathers in the kernel (x); dh and dW2 share XLA's gathered dO.
  fx = PallasKernels(backward_gathers="fused-x")
  for d, n in ((4096, 1024), (768, 512), (4096, 256)):
    assert fx._bwd_gather(d, n) == "fused-x"
    assert fx._dw1_config(d, 2 * n).gather == "fused"
    assert fx._dw1_config(d, 2 * n).num_compute_wgs == 2
    assert fx._dh_config(d, n).gather == "xla" and fx._dw2_config(n, d).gather == "xla"
  over = PallasKernels(config=ForwardConfig(dw1=WG_CFG))
  assert over._dw1_config(4096, 512) == WG_CFG
  assert PallasKernels() == PallasKernels(backward_gathers="auto")
  assert PallasKernels() != PallasKernels(backward_gathers="xla")
  with pytest.raises(ValueError, match="backward_gathers must be 'auto', 'xla', 'fused' or"):
    PallasKernels(backward_gathers="tma")


def test_layer_gradient_lowers_with_auto_fused_gathers():
  """The layer's gradient with the default PallasKernels at a shape where "auto" fuses the
  backward's gathers (n = 256: fused dh, two-consumer dW1 / dW2) lowers for CUDA on the CPU
  host, with no XLA gather of a (T·K, d) operand left in the backward's kernels' inputs."""
  import sonic_jax
  from sonic_jax.pallas.backend import PallasKernels
  t, d, n, e, k = 256, 256, 256, 4, 2
  kern = PallasKernels()
  assert kern._bwd_gather(d, n) == "fused"
  bf = jnp.bfloat16
  args = (jnp.zeros((t, d), bf), jnp.zeros((d, e), bf), jnp.zeros((e, d, 2 * n), bf),
          jnp.zeros((e, n, d), bf))
  loss = lambda *a: jnp.sum(sonic_jax.moe(*a, top_k=k, backend=kern).astype(jnp.float32))
  text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("cp.async.shared.global") >= 4  # up_proj, dh, dW1, dW2 gather in-kernel
