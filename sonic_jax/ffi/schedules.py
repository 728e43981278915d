"""Which CUTLASS tile schedule each grouped GEMM of the ffi backend runs (per kind and shape).

The configs are compiled into libsonic_jax_cuda.so (csrc/grouped_gemm.cuh); ``GemmConfig``
mirrors sonic::GemmConfig in csrc/sonic_ffi.h. ``pick`` returns the measured best config for a
(kind, N, K) shape when the H200 sweep covered it (``python -m sonic_jax.ffi.sweep``, results
in benchmarks/results/ffi-h200-2026-12-02-s2.md), else the kind's default (its best over the sweep).
"""

from __future__ import annotations

import enum


class GemmKind(enum.IntEnum):
  """Matches sonic::GemmKind in csrc/sonic_ffi.h."""
  VARLEN_M_NN_F32 = 0   # D[rows_e] = A[rows_e] · B_e, B_e (K, N)
  VARLEN_M_NN_BF16 = 1
  VARLEN_M_NT_F32 = 2   # D[rows_e] = A[rows_e] · B_eᵀ, B_e (N, K)
  VARLEN_M_NT_BF16 = 3
  VARLEN_K_F32 = 4      # D_e = A[rows_e]ᵀ · B[rows_e]
  # A rows gathered inside the GEMM (cp.async): D[p] = src[gather_idx[p]] · op(B_e).
  VARLEN_M_GATHER_NN_BF16 = 5  # B_e (K, N), bf16 out (up_proj)
  VARLEN_M_GATHER_NT_F32 = 6   # B_e (N, K) used transposed, fp32 out (dh)
  VARLEN_K_BF16 = 7     # varlen-K with bf16 out: weight gradients in the weights' dtype
  # The gathered GEMM with the SwiGLU epilogues fused (ops.up_proj_swiglu / ops.dh_dswiglu).
  VARLEN_M_GATHER_SWIGLU = 8   # up_proj: H (P, 2n) and A (P, n) from src[idx] · W1_e
  VARLEN_M_GATHER_DSWIGLU = 9  # dh: dH, A' and dS from dO[idx] · W2_eᵀ
  # Varlen-K with the rows of either operand read through an index (ops.gathered_varlen_k):
  # dW1 from x[idx] and dH, dW2 from A' and dO[idx]; bf16 out.
  VARLEN_K_GATHER_BF16 = 10


VARLEN_K_KINDS = (GemmKind.VARLEN_K_F32, GemmKind.VARLEN_K_BF16)
F32_OUT_KINDS = (GemmKind.VARLEN_M_NN_F32, GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_K_F32,
                 GemmKind.VARLEN_M_GATHER_NT_F32)


GATHER_KINDS = (GemmKind.VARLEN_M_GATHER_NN_BF16, GemmKind.VARLEN_M_GATHER_NT_F32)
FUSED_EPILOGUE_KINDS = (GemmKind.VARLEN_M_GATHER_SWIGLU, GemmKind.VARLEN_M_GATHER_DSWIGLU)


class GemmConfig(enum.IntEnum):
  """Matches sonic::GemmConfig in csrc/sonic_ffi.h."""
  PINGPONG_128x128_C2x1 = 0
  COOPERATIVE_128x256_C2x1 = 1
  COOPERATIVE_256x128_C2x1 = 2
  COOPERATIVE_128x256_C1x2 = 3
  # Gather kinds only: cp.async producer warpgroup, two consumer warpgroups, no cluster.
  GATHER_COOP_128x128 = 4
  GATHER_COOP_128x256 = 5
  # Gather kinds only, session 17 (compiled and layout-checked on the CPU, not yet run on a GPU):
  # the A rows by cp.async published with noinc mbarrier arrivals (the producer never waits for
  # its own copies), B_e by TMA multicast over a 2 x 1 cluster whose CTAs take neighbouring M
  # blocks of one expert (half the B bytes from L2 per CTA) ...
  GATHER_TMA_B_128x256_C2x1 = 6
  # ... or B_e by cp.async too (the noinc publication alone).
  GATHER_NOINC_128x256 = 7
  # The fused-epilogue kinds use the gather configs too. With SwiGLU a 128 x 256 tile holds 128
  # gate and 128 up columns (128 columns of A); with dSwiGLU 256 columns of dA'.
  # Gathered varlen-K only: as GATHER_TMA_B_128x256_C2x1 on a 256 x 128 tile, for dW2 (A' by
  # TMA on the 256-wide M side, the gathered dO rows on the 128-wide N side: each is read by
  # n / 256 M blocks, half as many as on the 128 x 256 tile, and half the cp.async bytes per
  # stage).
  GATHER_TMA_256x128_C2x1 = 8
  # ... and the same without the cluster: each CTA loads its whole A' tile (session 22, not yet
  # run on a GPU).
  GATHER_TMA_256x128_C1 = 9
  # Session 28, for the sweep. Varlen-M bf16 kinds: the 128 x 256 tile with both operands
  # multicast over a 2 x 2 cluster, or without a cluster, and ping-pong on 64 x 256 tiles
  # (m64n256 wgmmas per consumer, each one's epilogue under the other's mainloop). Varlen-K
  # bf16: the 2 x 2 cluster, COOPERATIVE_128x256_C2x1 and no cluster; the fp32 dh kind: no
  # cluster (added after the session's sweep, not yet timed).
  COOPERATIVE_128x256_C2x2 = 10
  COOPERATIVE_128x256_C1x1 = 11
  PINGPONG_64x256_C2x1 = 12
  # Gather kinds (session 28): GATHER_TMA_B_128x256_C2x1 without the cluster, each CTA loading
  # its whole B_e tile by TMA. Correct on the H100 (session 30); dh there 3.42 against 3.78 ms
  # at 120B-n1024, up_proj 7.59 against 7.30 (benchmarks/results/s30-h100-2026-12-07.md).
  GATHER_TMA_B_128x256_C1 = 13
  # Plain bf16 varlen-M and varlen-K kinds (session 29; correct on the H100 but slower than
  # CUTLASS on every GEMM, about 2x at N = 4096: benchmarks/results/s30-h100-2026-12-07.md;
  # ncu blamed the epilogue's half-sector bf16 stores; with whole-sector stores, session 31:
  # up_proj at parity, down_proj / dx_pairs 7-8 % slower, dW1 / dW2 17-64 % slower,
  # benchmarks/results/s31-h100-2026-12-07.md; opt-in for the sweep): our kernels
  # (gather_gemm.cuh, gather_wgrad.cuh) with both operands by TMA from one descriptor each, no
  # cluster. CUTLASS's ptr-array kernel rewrites per-group tensor maps whenever a CTA moves to
  # another expert; these never do. Varlen-M masks each tile's rows past its group at the
  # store; varlen-K zeroes both operands' rows past the group end in its last K block.
  TMA_AB_128x256_C1 = 14
  # Session 32 (correct on the H100, slower than the cooperative configs, session 33): ping-pong on
  # 64 x 256 tiles, each consumer warpgroup a whole tile (m64n256 wgmmas), the two taking turns,
  # so one's epilogue runs under the other's mainloop (what SonicMoE does for its dH kernel).
  # Gather and fused-epilogue kinds: B_e by TMA over a 2 x 1 cluster (15) or without (16); the
  # SwiGLU kind also over rows in order with A by TMA (17, TMA_AB_128x256_C1's ping-pong form).
  GATHER_PINGPONG_64x256_C2x1 = 15
  GATHER_PINGPONG_64x256_C1 = 16
  TMA_AB_PINGPONG_64x256_C1 = 17
  # Session 35 (varlen-M bf16 kinds, for the sweep; GPU-tested in session 37, where they won no
  # GEMM at 120B-n512 or the n = 256 configs: benchmarks/results/s37-2026-12-07.md): CUTLASS's
  # ping-pong without a cluster. The cooperative 128 x 256 tile beat its 2 x 1 cluster form at
  # every shape swept since session 28, and ping-pong was only timed over that cluster (12, 0);
  # down_proj at n = 256 (four K blocks per tile) is the GEMM furthest from dense (0.66-0.71x on
  # the H200), its epilogue exposed after each cooperative tile.
  PINGPONG_128x128_C1x1 = 18
  PINGPONG_64x256_C1x1 = 19


_M_CONFIGS = (GemmConfig.PINGPONG_128x128_C2x1, GemmConfig.COOPERATIVE_128x256_C2x1,
              GemmConfig.COOPERATIVE_256x128_C2x1)
_M_BF16_CONFIGS = _M_CONFIGS + (GemmConfig.COOPERATIVE_128x256_C2x2,
                                GemmConfig.COOPERATIVE_128x256_C1x1,
                                GemmConfig.PINGPONG_64x256_C2x1,
                                GemmConfig.TMA_AB_128x256_C1,
                                GemmConfig.PINGPONG_128x128_C1x1,
                                GemmConfig.PINGPONG_64x256_C1x1)

_GATHER_CONFIGS = (GemmConfig.GATHER_COOP_128x128, GemmConfig.GATHER_COOP_128x256,
                   GemmConfig.GATHER_TMA_B_128x256_C2x1, GemmConfig.GATHER_NOINC_128x256,
                   GemmConfig.GATHER_TMA_B_128x256_C1,
                   GemmConfig.GATHER_PINGPONG_64x256_C2x1, GemmConfig.GATHER_PINGPONG_64x256_C1)

# The configs instantiated for each kind (csrc/gemm_varlen_*.cu).
INSTANTIATED: dict[GemmKind, tuple[GemmConfig, ...]] = {
    GemmKind.VARLEN_M_NN_F32: (GemmConfig.PINGPONG_128x128_C2x1,),
    GemmKind.VARLEN_M_NN_BF16: _M_BF16_CONFIGS,
    GemmKind.VARLEN_M_NT_F32: _M_CONFIGS + (GemmConfig.COOPERATIVE_128x256_C1x1,),
    GemmKind.VARLEN_M_NT_BF16: _M_BF16_CONFIGS,
    GemmKind.VARLEN_K_F32: (GemmConfig.PINGPONG_128x128_C2x1,
                            GemmConfig.COOPERATIVE_128x256_C1x2),
    GemmKind.VARLEN_K_BF16: (GemmConfig.PINGPONG_128x128_C2x1,
                             GemmConfig.COOPERATIVE_128x256_C1x2,
                             GemmConfig.COOPERATIVE_128x256_C2x1,
                             GemmConfig.COOPERATIVE_128x256_C2x2,
                             GemmConfig.COOPERATIVE_128x256_C1x1,
                             GemmConfig.TMA_AB_128x256_C1),
    GemmKind.VARLEN_M_GATHER_NN_BF16: _GATHER_CONFIGS,
    GemmKind.VARLEN_M_GATHER_NT_F32: _GATHER_CONFIGS,
    # And config 14 (session 31): A already gathered and W1_e by TMA, SwiGLU in the epilogue
    # (correct; 8-9 % slower than CUTLASS's GEMM + swiglu_from_h on the H100), and its
    # ping-pong form 17 (session 32).
    GemmKind.VARLEN_M_GATHER_SWIGLU: _GATHER_CONFIGS + (GemmConfig.TMA_AB_128x256_C1,
                                                        GemmConfig.TMA_AB_PINGPONG_64x256_C1),
    GemmKind.VARLEN_M_GATHER_DSWIGLU: _GATHER_CONFIGS,
    # 6, 8 and 9: the operand read in order (dW1's dH, dW2's A') by TMA, multicast over a
    # 2-CTA cluster on a 128 x 256 (6) or 256 x 128 (8) tile, or without one on 256 x 128 (9).
    GemmKind.VARLEN_K_GATHER_BF16: (GemmConfig.GATHER_COOP_128x256,
                                    GemmConfig.GATHER_TMA_B_128x256_C2x1,
                                    GemmConfig.GATHER_TMA_256x128_C2x1,
                                    GemmConfig.GATHER_TMA_256x128_C1),
}

# Default per kind: the cooperative 128x256 tile won 5 of the 6 fully swept varlen-M shapes of
# the H200 sweep (2026-12-02, T=32768, d=4096, n=1024 and n=512, E=128, K=8), by 1.2-1.3x on the
# up_proj, dh and dx_pairs GEMMs; for varlen-K the two configs are within 5%.
# Session 28 (H100, sweep --gemms-only at T=32768, d=4096, E=128, K=8): the same tile without
# the 2 x 1 cluster is faster for the bf16 varlen-M GEMMs (a cluster's two CTAs must share a GPC
# and each group's M blocks are rounded up to even): at n=1024 up_proj 6.147 vs 6.600 ms,
# down_proj 3.320 vs 3.388, dx_pairs 6.198 vs 6.394; at n=512 up_proj 3.081 vs 3.166, dx_pairs
# 3.383 vs 3.407 (benchmarks/results/s28-h100-2026-12-06.md). Where a 2 x 2 cluster or
# ping-pong 64 x 256 was timed, it lost.
DEFAULT: dict[GemmKind, GemmConfig] = {
    GemmKind.VARLEN_M_NN_F32: GemmConfig.PINGPONG_128x128_C2x1,
    GemmKind.VARLEN_M_NN_BF16: GemmConfig.COOPERATIVE_128x256_C1x1,
    GemmKind.VARLEN_M_NT_F32: GemmConfig.COOPERATIVE_128x256_C2x1,
    GemmKind.VARLEN_M_NT_BF16: GemmConfig.COOPERATIVE_128x256_C1x1,
    GemmKind.VARLEN_K_F32: GemmConfig.COOPERATIVE_128x256_C1x2,
    GemmKind.VARLEN_K_BF16: GemmConfig.COOPERATIVE_128x256_C1x2,  # the fp32 kind's default
    # The wider tile wins both (H200, T=32768, d=4096, n=1024, E=128, K=8): up_proj 9.354 vs
    # 10.292 ms, dh 4.324 vs 4.923 (benchmarks/results/raw/ffi-fused-h200-2026-12-03-s6/).
    # Since session 18 the TMA-multicast weights (H200, 120B-n1024): up_proj 6.93 vs 9.19 ms,
    # dh 3.53 vs 4.53 (benchmarks/results/ffi-gather-schedules-h200-2026-12-05-s18.md).
    GemmKind.VARLEN_M_GATHER_NN_BF16: GemmConfig.GATHER_TMA_B_128x256_C2x1,
    GemmKind.VARLEN_M_GATHER_NT_F32: GemmConfig.GATHER_TMA_B_128x256_C2x1,
    # The wider tile: up_proj 9.834 vs 11.305 ms, dh 6.395 vs 6.398 (H200, T=32768, d=4096,
    # n=1024, E=128, K=8; 0.898 vs 1.035 and 0.768 vs 0.750 at the 7B-n256 shape; session 16,
    # benchmarks/results/ffi-fused-epilogue-h200-2026-12-04-s16.md).
    # Session 18: TMA-multicast weights, as for the plain gathered kinds (the layer with both
    # epilogues fused: 36.13 ms under tma_b's fused gather vs 39.64 under cp_async).
    GemmKind.VARLEN_M_GATHER_SWIGLU: GemmConfig.GATHER_TMA_B_128x256_C2x1,
    GemmKind.VARLEN_M_GATHER_DSWIGLU: GemmConfig.GATHER_TMA_B_128x256_C2x1,
    # The schedule that takes both operands gathered (correct on the H200, slow: session 20);
    # where one operand is read in order ops.gathered_varlen_k picks a TMA schedule instead
    # (IN_ORDER_WGRAD).
    GemmKind.VARLEN_K_GATHER_BF16: GemmConfig.GATHER_COOP_128x256,
}

# The gathered varlen-K schedule where one operand is read in order, by which one it is: the tile's
# 128-wide side takes the gathered operand (x's d columns for dW1, dO's d columns for dW2), so
# that each gathered row is re-read by as few blocks of the other side as the 256-wide tile allows.
IN_ORDER_WGRAD: dict[str, GemmConfig] = {
    "b": GemmConfig.GATHER_TMA_B_128x256_C2x1,  # dW1: dH (N = 2n) in order, x (M = d) gathered
    "a": GemmConfig.GATHER_TMA_256x128_C2x1,    # dW2: A' (M = n) in order, dO (N = d) gathered
}
# Configs of VARLEN_M_GATHER_SWIGLU that read src's rows in order by TMA (no gather_idx):
# up_proj's SwiGLU in the epilogue of the GEMM over the gathered copy of x (csrc/
# gemm_varlen_m_swiglu.cu's dispatch_swiglu; FfiKernels(up_proj_epilogue="gemm")).
SWIGLU_IN_ORDER_CONFIGS = (GemmConfig.TMA_AB_128x256_C1, GemmConfig.TMA_AB_PINGPONG_64x256_C1)

# The schedules that read one operand in order by TMA (a_idx or b_idx must be None): all but the
# one that copies both by cp.async.
IN_ORDER_WGRAD_CONFIGS = tuple(c for c in INSTANTIATED[GemmKind.VARLEN_K_GATHER_BF16]
                               if c != GemmConfig.GATHER_COOP_128x256)

# (kind, dim0, dim1) -> config where the sweep's winner differs from DEFAULT. varlen-M:
# (N, K) = output columns and reduction size; varlen-K: (M, N), the shape of each D_e.
MEASURED: dict[tuple[GemmKind, int, int], GemmConfig] = {
    # down_proj at n=512: ping-pong 1.826 ms vs cooperative 1.929 ms.
    (GemmKind.VARLEN_M_NN_BF16, 4096, 512): GemmConfig.PINGPONG_128x128_C2x1,
    # dw2 at n=1024: ping-pong 3.289 ms vs cooperative 3.433 ms.
    (GemmKind.VARLEN_K_F32, 1024, 4096): GemmConfig.PINGPONG_128x128_C2x1,
    # Session 18's sweep at n = 256 (H200, benchmarks/results/raw/ffi-sweep-n256-h200-2026-12-05-s18/),
    # the winners by more than 2 %: dw2 (bf16 dW) at 1.4B-n256 0.223 vs 0.266 ms and at 7B-n256
    # 0.262 vs 0.271; dx_pairs at 30B-n256 3.578 vs 3.790.
    (GemmKind.VARLEN_K_BF16, 256, 768): GemmConfig.PINGPONG_128x128_C2x1,
    (GemmKind.VARLEN_K_BF16, 256, 1536): GemmConfig.PINGPONG_128x128_C2x1,
    (GemmKind.VARLEN_M_NT_BF16, 4096, 512): GemmConfig.PINGPONG_128x128_C2x1,
}


def pick(kind: GemmKind, dim0: int, dim1: int) -> GemmConfig:
  """Tile schedule for ``kind``: varlen-M (dim0, dim1) = (N, K), varlen-K = (M, N) of D_e."""
  kind = GemmKind(kind)
  return MEASURED.get((kind, dim0, dim1), DEFAULT[kind])


def check(kind: GemmKind, config: int) -> GemmConfig:
  """``config`` as a GemmConfig; ValueError naming the kind when it is not instantiated."""
  kind = GemmKind(kind)
  if config not in [int(c) for c in INSTANTIATED[kind]]:
    raise ValueError(f"config must be one of {[c.name for c in INSTANTIATED[kind]]} for "
                     f"{kind.name}, got {config}")
  return GemmConfig(config)
