// Varlen-M grouped GEMM whose A rows are read through a row index inside the mainloop, shared by
// the plain gathered kinds (gemm_varlen_m_gather.cu) and the fused-epilogue kinds
// (gemm_varlen_m_swiglu.cu):
//   D[p, :] = src[gather_idx[p], :] · op(B_e)   for p in [group_offsets[e], group_offsets[e+1]).
// TMA cannot gather rows on Hopper, so one producer warpgroup moves 16-byte chunks of A (through
// gather_idx) and of B_e with cp.async (zero-fill for rows past the group end and for the N / K
// residues) into the swizzled shared-memory stages that CUTLASS's cp.async GMMA mainloop
// (MainloopSm90CpAsyncGmmaWarpSpecialized) consumes; its `mma` runs on two consumer warpgroups.
// cp.async writes shared memory through the generic proxy and WGMMA reads it through the async
// proxy, so a stage is published only after the producer thread waited for its copies and
// issued fence.proxy.async (one stage later than it was issued, keeping two stages in flight).
// The kernel is persistent over a linear tile index: a metadata kernel in the same call turns
// group_offsets into per-expert tile prefixes (workspace), and every warpgroup maps a tile id to
// (expert, M block, N block) by binary search on them. Nothing is read on the host.
//
// Epilogues (Epi):
//   kStore    D (bf16 or fp32) straight from the accumulators.
//   kSwiGLU   up_proj: the B stage holds w1's gate columns [n0, n0 + BN/2) in its first half and
//             the up columns [n + n0, ...) in its second, so each thread holds gate and up of the
//             same (row, column) in its accumulators (checked on the host: layout_ok). Writes
//             H = bf16([gate | up]) (P, 2n) and A = silu(g)·u (P, n) from the bf16 H, as the
//             backward recomputes it.
//   kDSwiGLU  dh: the accumulators are dA' = dO·W2ᵀ (P, n) in fp32; the epilogue loads H and the
//             scores and writes dH = s·dSwiGLU(dA') (P, 2n), A' = s·A (P, n) and per-tile partial
//             sums dS_part (P, n_tiles) of ⟨dA', A⟩ (reduced over the quad of lanes that share
//             a row; the caller sums the n_tiles columns: no atomics, deterministic).
// gather_idx == nullptr reads row p of src (already gathered, e.g. by scatter_rows).
//
// Schedules: B_e by cp.async as well (configs 4, 5, 7), or by TMA multicast over a 2 x 1 cluster
// (config 6, kTmaB: see GatherTmaB128x256C2x1), the A rows always by cp.async; stages published
// after the producer's own wait (4, 5) or by noinc mbarrier arrivals (6, 7: kNoinc).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdlib>
#include <type_traits>
#include <cub/block/block_scan.cuh>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "grouped_gemm.cuh"
#include "swiglu_math.cuh"

namespace sonic {
namespace gather {

using Bf16 = cutlass::bfloat16_t;

// Tile schedules of the gather kinds (sonic::GemmConfig 4, 5 and 6). Cooperative: the two consumer
// warpgroups split the M rows of one tile. All 384 threads fit in 168 registers (ptxas: 154-160
// for 128x256 with the plain and SwiGLU epilogues), except the dSwiGLU epilogue's consumers,
// which take registers from the producer by setmaxnreg (kRegRealloc).
// kTmaB = false: the producer copies A and B_e with cp.async, one CTA per tile, no cluster.
// kTmaB = true: only A (the gathered rows) uses cp.async; B_e comes by TMA, multicast over a
// 2 x 1 cluster whose two CTAs take neighbouring M blocks of one expert and the same N block, so
// each CTA reads half of the B tile from L2 (what CUTLASS's TMA GEMM does for the unfused
// kinds). The cp.async mainloop at 128 x 256 x 64 reads 48 KiB per stage from L2 per CTA, this
// one 32 KiB, and its producer issues a third of the cp.async instructions.
// kNoinc = false: a producer thread publishes a stage (full-barrier arrive) after waiting for its
// own copies of it with cp.async.wait_group one stage later and fencing (Publisher), so each
// thread has at most two stages of copies in flight.
// kNoinc = true: it publishes with cp.async.mbarrier.arrive.noinc right after issuing the copies
// (the arrival happens when they land), so it keeps loading into every free stage; the consumers
// then fence the generic proxy against the async proxy after their wait (consume). The Pallas
// backend's fused gather went from 10.77 to 7.77 ms at 120B-n1024 with this change (session 4).
struct GatherCoop128x128 {
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  static constexpr bool kTmaB = false, kNoinc = false;
};
struct GatherCoop128x256 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  static constexpr bool kTmaB = false, kNoinc = false;
};
struct GatherTmaB128x256C2x1 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true;
};
struct GatherNoinc128x256 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  static constexpr bool kTmaB = false, kNoinc = true;
};
// Session 28: as GatherTmaB128x256C2x1 without the cluster (each CTA loads its whole B tile by
// TMA): the plain grouped GEMMs ran faster without their 2 x 1 cluster on the H100 (a cluster's
// CTAs share a GPC, and each expert's M blocks are rounded up to even).
struct GatherTmaB128x256C1 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true;
  static constexpr int kCluster = 1;
};
// Session 29, for the plain varlen-M bf16 kinds (no gather: sonic::GemmConfig 14): A by TMA too,
// from one descriptor over all P rows, and B_e from the stacked-experts descriptor, so nothing
// is rewritten when a CTA moves to another expert (CUTLASS's ptr-array kernel updates its
// per-group tensor maps in the mainloop; each CTA changes expert every two or three tiles at
// E = 128). Only the leader thread of the producer warpgroup issues copies.
struct TmaAB128x256C1 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true, kTmaA = true;
  static constexpr int kCluster = 1;
};
// Session 32 (compiled and layout-checked on the CPU, not yet run on a GPU): ping-pong. Each
// consumer warpgroup owns a whole 64 x 256 tile (m64n256 wgmmas) and the two take this CTA's
// tiles in turn, so one warpgroup's epilogue runs under the other's mainloop (SonicMoE runs its
// dH kernel ping-pong for that reason). B_e by TMA multicast over a 2 x 1 cluster (the two CTAs
// take neighbouring 64-row blocks: per CTA as many B bytes from L2 per output row as the
// 128 x 256 tile without a cluster) or, C1, without one; A by cp.async through gather_idx.
struct GatherPingpong64x256C2x1 {
  using Tile = cute::Shape<cute::_64, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true, kPingpong = true;
};
struct GatherPingpong64x256C1 {
  using Tile = cute::Shape<cute::_64, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true, kPingpong = true;
  static constexpr int kCluster = 1;
};
// ... and TmaAB128x256C1's ping-pong form (A in order by TMA too), for the SwiGLU epilogue over
// the gathered copy of x (sonic::GemmConfig 17).
struct TmaABPingpong64x256C1 {
  using Tile = cute::Shape<cute::_64, cute::_256, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true, kTmaA = true, kPingpong = true;
  static constexpr int kCluster = 1;
};
// Whether a config is ping-pong: false unless it says kPingpong.
template <class C, class = void>
struct PingpongOf {
  static constexpr bool value = false;
};
template <class C>
struct PingpongOf<C, std::void_t<decltype(C::kPingpong)>> {
  static constexpr bool value = C::kPingpong;
};
// Whether a config loads A by TMA (TmaAB128x256C1): false unless it says kTmaA.
template <class C, class = void>
struct TmaAOf {
  static constexpr bool value = false;
};
template <class C>
struct TmaAOf<C, std::void_t<decltype(C::kTmaA)>> {
  static constexpr bool value = C::kTmaA;
};
// CTAs per cluster of a TMA config (here and in gather_wgrad.cuh): 2 unless it says kCluster.
template <class C, class = void>
struct GatherClusterOf {
  static constexpr int value = 2;
};
template <class C>
struct GatherClusterOf<C, std::void_t<decltype(C::kCluster)>> {
  static constexpr int value = C::kCluster;
};
// Gathered varlen-K only (gather_wgrad.cuh): as GatherTmaB128x256C2x1 with the tile's wide side
// on M, for dW2, whose A' (M = n) comes by TMA and whose gathered dO rows (N = d) by cp.async:
// each gathered row is then read by n / 256 M blocks instead of n / 128, and a stage holds 16
// instead of 32 KiB of cp.async copies (the TMA operand is the one shared by the cluster).
struct GatherTma256x128C2x1 {
  using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true;
};

// The CUTLASS collective whose types (TiledMma, swizzled stage layouts, stage count, pipeline)
// and consumer half (`mma`) the kernel uses: the cp.async one, or the TMA one of a 2 x 1 cluster,
// whose PipelineTmaAsync releases a stage to both CTAs' producers. Ping-pong: the same with the
// one-warpgroup TiledMma of CUTLASS's ping-pong schedules.
template <bool kTmaB, class LayoutB, class Tile, int kCluster = 2, bool kPingpong = false>
struct MainloopOf {
  using type = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t,
      cutlass::layout::RowMajor, 8, cutlass::bfloat16_t, LayoutB, 8, float, Tile,
      cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<1024>,
      cute::conditional_t<kPingpong, cutlass::gemm::KernelCpAsyncWarpSpecializedPingpong,
                          cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>>::CollectiveOp;
};
template <class LayoutB, class Tile, int kCluster, bool kPingpong>
struct MainloopOf<true, LayoutB, Tile, kCluster, kPingpong> {
  using type = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t,
      cutlass::layout::RowMajor, 8, cutlass::bfloat16_t, LayoutB, 8, float, Tile,
      cute::Shape<cute::Int<kCluster>, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<1024>,
      cute::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperative>>::CollectiveOp;
};

// Ping-pong's order of the two consumer warpgroups' mainloops (tile 0 by warpgroup 0, tile 1
// by warpgroup 1, tile 2 by 0, ...): a warpgroup starts waiting for its next tile's stages only
// after the other one issued every wgmma of the tile between. Needed for correctness, not only
// speed: the stages of that tile are skipped by this warpgroup, and a full barrier waited on
// while two phases behind would pass on the parity of the older phase (CUTLASS's ping-pong
// kernel orders its math warpgroups the same way). Off: no-ops.
template <bool kOn>
struct MathOrder {
  struct SharedStorage {};
  __device__ MathOrder(SharedStorage&, int) {}
  __device__ void wait() {}
  __device__ void arrive() {}
};
template <>
struct MathOrder<true> {
  using Barrier = cutlass::OrderedSequenceBarrier<1, 2>;
  using SharedStorage = typename Barrier::SharedStorage;
  Barrier bar;
  // Every thread of the CTA constructs it (warp 0 initialises the barriers); `group` is the
  // consumer warpgroup (0 or 1), all of whose threads arrive.
  __device__ MathOrder(SharedStorage& s, int group)
      : bar(s, {static_cast<uint32_t>(group), uint32_t(cutlass::NumThreadsPerWarpGroup)}) {}
  __device__ void wait() { bar.wait(); }
  __device__ void arrive() { bar.arrive(); }
};

// 16-byte cp.async through L2 only (gathered rows are shared by the CTAs of one M block, not by
// the warps of one CTA) to shared-memory address `dst` (cute::cast_smem_ptr_to_uint); `valid`
// false writes zeros without reading `gmem`.
__device__ __forceinline__ void cp_async_16_u32(uint32_t dst, const void* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16_u32(cute::cast_smem_ptr_to_uint(smem), gmem, valid);
}

// ---- Epilogue stores of bf16 pairs in whole 32-byte sectors.
// A WGMMA accumulator fragment holds, per group of 8 values (4 column pairs), columns
// c0 + 2q, c0 + 2q + 1 and c0 + 8 + 2q, c0 + 9 + 2q (q = lane & 3, c0 a multiple of 16) of rows r
// and r + 8. Stored as is, each warp store writes 4 bytes per lane, 16 per quad and row: half a
// 32-byte sector, so every sector takes two L2 write transactions. For 128 x 256 bf16 tiles that
// saturated L2 and about doubled DRAM traffic (ncu on the H100, session 30: down_proj under
// config 14 at L2 throughput 84 % and L2 hit rate 68 %, against 53 % and 86 % for CUTLASS's TMA
// store). store_quad_16cols first swaps the quad's values (a 4 x 4 transpose by three shuffles)
// so that lane q holds 8 consecutive columns, c0 + 8·(q & 1) .., of row r + 8·(q >> 1): one
// 16-byte store per lane, a whole sector per lane pair.

// v[i] for a run-time i in [0, 4) by selects (no local-memory array).
__device__ __forceinline__ uint32_t pick4(const uint32_t (&v)[4], int i) {
  uint32_t r = v[0];
  r = i == 1 ? v[1] : r;
  r = i == 2 ? v[2] : r;
  return i == 3 ? v[3] : r;
}

// w: this lane's bf16 pairs of the group in fragment order, (r, c0 + 2q), (r + 8, c0 + 2q),
// (r, c0 + 8 + 2q), (r + 8, c0 + 8 + 2q). row_r / row_r8: the element (r, c0) / (r + 8, c0) of
// the output; ok_r / ok_r8: whether the row is stored; cols_left: output columns from c0 on
// (a multiple of 8). Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void store_quad_16cols(const uint32_t (&w)[4], Bf16* row_r,
                                                  Bf16* row_r8, bool ok_r, bool ok_r8,
                                                  int cols_left) {
  const int lane = static_cast<int>(threadIdx.x & 31), q = lane & 3;
  // Lane t's result takes pair ((t & 1) << 1) | (t >> 1) of every lane. Round s: send the pair
  // lane (q + s) & 3 wants, receive lane (q - s) & 3's pair for this lane.
  uint32_t got[4];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < 4; ++s) {
    const int to = (q + s) & 3;
    const uint32_t send = pick4(w, ((to & 1) << 1) | (to >> 1));
    got[s] = s == 0 ? send : __shfl_sync(0xffffffffu, send, (lane & ~3) | ((q - s) & 3));
  }
  // Element k of the result came from lane k, in round (q - k) & 3.
  const uint4 v = make_uint4(pick4(got, q), pick4(got, (q - 1) & 3), pick4(got, (q - 2) & 3),
                             pick4(got, (q - 3) & 3));
  const int c = 8 * (q & 1);
  if ((q < 2 ? ok_r : ok_r8) && c < cols_left) {
    *reinterpret_cast<uint4*>((q < 2 ? row_r : row_r8) + c) = v;
  }
}

// The inverse, for epilogue loads: lane q loads 8 consecutive bf16 columns, c0 + 8·(q & 1) ..,
// of row r + 8·(q >> 1) as one 16-byte load (zeros where `ok` is false: row past the group or
// columns from cols_left on), and the quad's 4 x 4 transpose by three shuffles returns this
// lane's pairs in fragment order, (r, c0 + 2q), (r + 8, c0 + 2q), (r, c0 + 8 + 2q),
// (r + 8, c0 + 8 + 2q): whole 32-byte sectors per lane pair and a quarter of the load
// instructions of 4-byte loads in fragment order. row_r / row_r8: the element (r, c0) /
// (r + 8, c0), 16-byte aligned. Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void load_quad_16cols(const Bf16* row_r, const Bf16* row_r8, bool ok_r,
                                                 bool ok_r8, int cols_left, uint32_t (&w)[4]) {
  const int lane = static_cast<int>(threadIdx.x & 31), q = lane & 3;
  const int c = 8 * (q & 1);
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if ((q < 2 ? ok_r : ok_r8) && c < cols_left) {
    v = __ldg(reinterpret_cast<const uint4*>((q < 2 ? row_r : row_r8) + c));
  }
  const uint32_t mine[4] = {v.x, v.y, v.z, v.w};  // pairs k = 0..3 of this lane's 8 columns
  // Round s: send lane (q + s) & 3 its pair (element k = that lane's q), receive from lane
  // (q - s) & 3.
  uint32_t got[4];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < 4; ++s) {
    const uint32_t send = pick4(mine, (q + s) & 3);
    got[s] = s == 0 ? send : __shfl_sync(0xffffffffu, send, (lane & ~3) | ((q - s) & 3));
  }
  // Fragment pair j is held by lane ((j & 1) << 1) | (j >> 1) (row half j & 1, column block
  // j >> 1), received in round (q - that lane) & 3: lanes 0, 2, 1, 3 for j = 0..3.
  w[0] = pick4(got, q);
  w[1] = pick4(got, (q - 2) & 3);
  w[2] = pick4(got, (q - 1) & 3);
  w[3] = pick4(got, (q - 3) & 3);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A thread's accumulator fragment `acc` of an output tile at d (leading dimension ld, a multiple
// of 8), `coord` its (row, column) in the tile (TiledMma::partition_C of an identity tensor);
// rows >= rows and columns >= cols (a multiple of 8) are not written. fp32: column pairs (c, c +
// 1), c even, as one 8-byte store, whole 32-byte sectors per quad already. bf16: groups of 8
// values through store_quad_16cols, one 16-byte store per lane (quad_groups_ok checks the
// fragment layout this assumes). Every lane of the warp must call it (shuffles).
template <class Out, class Coord, class Accum>
__device__ __forceinline__ void store_acc_tile(Out* d, int64_t ld, int rows, int cols,
                                               const Coord& coord, const Accum& acc,
                                               int mma_tid) {
  using namespace cute;
  constexpr int kSize = decltype(size(coord))::value;
  static_assert(kSize % 8 == 0, "groups of 8 accumulator values (quad_groups_ok)");
  if constexpr (cute::is_same_v<Out, float>) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kSize; i += 2) {  // cols % 8 == 0 and c even: c + 1 < cols too
      const int r = get<0>(coord(i)), c = get<1>(coord(i));
      if (r < rows && c < cols) {
        *reinterpret_cast<float2*>(d + int64_t(r) * ld + c) = make_float2(acc(i), acc(i + 1));
      }
    }
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kSize; g += 8) {
      const int r = get<0>(coord(g)), c0 = get<1>(coord(g)) - 2 * (mma_tid & 3);
      const uint32_t w[4] = {pack_bf16x2(acc(g), acc(g + 1)), pack_bf16x2(acc(g + 2), acc(g + 3)),
                             pack_bf16x2(acc(g + 4), acc(g + 5)),
                             pack_bf16x2(acc(g + 6), acc(g + 7))};
      Bf16* row = d + int64_t(r) * ld + c0;
      store_quad_16cols(w, row, row + 8 * ld, r < rows, r + 8 < rows, cols - c0);
    }
  }
}

// Host check of what store_quad_16cols assumes of a (kM, kN) tile's accumulator fragments under
// TiledMma: every group of 8 values of thread t is the four pairs above, with r and c0 (a
// multiple of 16) shared by the four lanes of t's quad.
template <class TiledMma, int kM, int kN>
bool quad_groups_ok() {
  using namespace cute;
  auto coords = [](int t) {
    return TiledMma{}.get_slice(t).partition_C(make_identity_tensor(make_shape(Int<kM>{}, Int<kN>{})));
  };
  constexpr int kSize = decltype(size(coords(0)))::value;
  if (kSize % 8 != 0) return false;
  for (int t = 0; t < int(size(TiledMma{})); ++t) {
    auto coord = coords(t);
    auto quad0 = coords(t & ~3);
    const int q = t & 3;
    for (int g = 0; g < kSize; g += 8) {
      const int r = get<0>(coord(g)), c0 = get<1>(coord(g)) - 2 * q;
      if (c0 % 16 != 0 || get<0>(quad0(g)) != r || get<1>(quad0(g)) != c0) return false;
      for (int i = 0; i < 8; ++i) {
        const int want_r = r + 8 * ((i >> 1) & 1), want_c = c0 + 8 * (i >> 2) + 2 * q + (i & 1);
        if (get<0>(coord(g + i)) != want_r || get<1>(coord(g + i)) != want_c) return false;
      }
    }
  }
  return true;
}

// Host check of a TMA-filled stage layout: for every (column, k, stage) of a (width, bk, stages)
// layout, the element's address must be stage · width · bk + in_stage(column, k), where the TMA
// boxes put it (128-byte swizzle: tma_swizzle_128b). Allocates one layout's worth of memory.
inline int64_t tma_swizzle_128b(int64_t x) {  // in bf16 elements: 16-byte chunk ^= row mod 8
  return x ^ (((x >> 6) & 7) << 3);
}

template <class Layout, class InStage>
bool stage_layout_is(int width, int bk, int stages, InStage in_stage) {
  using namespace cute;
  const size_t elems = size_t(width) * bk * stages;
  void* buf = std::aligned_alloc(1024, elems * sizeof(Bf16));
  if (buf == nullptr) return false;
  Bf16* base = static_cast<Bf16*>(buf);
  Tensor st_tensor = make_tensor(make_smem_ptr(base), Layout{});
  bool ok = size(st_tensor) == int64_t(elems);
  for (int st = 0; ok && st < stages; ++st) {
    for (int c = 0; ok && c < width; ++c) {
      for (int k = 0; ok && k < bk; ++k) {
        ok = &st_tensor(c, k, st) - base == int64_t(st) * width * bk + in_stage(c, k);
      }
    }
  }
  std::free(buf);
  return ok;
}

// What the consumers do with a finished accumulator tile (see the top of this file).
enum class Epi { kStore, kSwiGLU, kDSwiGLU };

// kNT: B_e is (N, K) row-major (used transposed); else (K, N) row-major. Out: D's type (kStore).
template <bool kNT, class Out, class Config, Epi kEpi>
struct GatherGemm {
  using Tile = typename Config::Tile;
  using OutType = Out;
  static constexpr int kBM = cute::size<0>(Tile{});
  static constexpr int kBN = cute::size<1>(Tile{});
  static constexpr int kBK = cute::size<2>(Tile{});
  static constexpr int kChunk = 8;  // bf16 elements per 16-byte cp.async
  // Output columns per tile: kSwiGLU's BN accumulator columns are BN/2 gate and BN/2 up.
  static constexpr int kTileN = kEpi == Epi::kSwiGLU ? kBN / 2 : kBN;
  static constexpr bool kNTLayout = kNT;
  static constexpr Epi kEpilogue = kEpi;
  static constexpr bool kFused = kEpi != Epi::kStore;
  static_assert(kEpi != Epi::kSwiGLU || !kNT, "the SwiGLU epilogue is up_proj's (B_e (K, 2n))");
  static_assert(kEpi != Epi::kDSwiGLU || kNT, "the dSwiGLU epilogue is dh's (B_e = W2_e (n, d))");
  using LayoutB = cute::conditional_t<kNT, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  // Only the mainloop's types and its consumer half are used: TiledMma, the swizzled stage
  // layouts, the stage count and the pipeline the producer below fills.
  static constexpr bool kTmaB = Config::kTmaB;
  static constexpr bool kNoinc = Config::kNoinc;
  static_assert(!kTmaB || kNoinc, "the TMA-B schedule publishes its A copies with noinc arrivals");
  // CTAs sharing one B tile (neighbouring M blocks): 2, or 1 for GatherTmaB128x256C1.
  static constexpr int kClusterM = kTmaB ? GatherClusterOf<Config>::value : 1;
  static_assert(kClusterM == 1 || kClusterM == 2, "one CTA or a pair per B tile");
  // A by TMA as well (no gather): the producer's leader thread issues every copy.
  static constexpr bool kTmaA = TmaAOf<Config>::value;
  // The SwiGLU epilogue stores only the tile's rows of its group, as the plain one does; the
  // dSwiGLU one is left to the gathering schedules (it lost to the separate kernels, session 31).
  static_assert(!kTmaA || (kTmaB && kClusterM == 1 && kEpi != Epi::kDSwiGLU),
                "A by TMA: plain or SwiGLU epilogue, B by TMA, no cluster");
  // Ping-pong: each consumer warpgroup runs a whole tile (see GatherPingpong64x256C2x1).
  static constexpr bool kPingpong = PingpongOf<Config>::value;
  static_assert(!kPingpong || kNoinc, "ping-pong consumers run `consume`");
  using Mainloop = typename MainloopOf<kTmaB, LayoutB, Tile, kClusterM, kPingpong>::type;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipeState = typename Mainloop::PipelineState;
  using SmemLayoutA = typename Mainloop::SmemLayoutA;  // (BM, BK, stages)
  using SmemLayoutB = typename Mainloop::SmemLayoutB;  // (BN, BK, stages)
  // The epilogues' accumulator layout is the cp.async schedule's (layout_ok checks it for both).
  using CpAsyncTiledMma =
      typename MainloopOf<false, LayoutB, Tile, 1, kPingpong>::type::TiledMma;
  static_assert(cute::is_same_v<TiledMma, CpAsyncTiledMma>,
                "the TMA schedule must keep the cp.async schedule's accumulator layout");
  static constexpr int kBStageBytes = kBN * kBK * int(sizeof(Bf16));
  static constexpr int kAStageBytes = kBM * kBK * int(sizeof(Bf16));
  static_assert(!kTmaA || (kBK == 64 && kBM <= 256), "TMA A boxes: 64 columns x BM <= 256 rows");
  // TMA boxes of B: 64 bf16 (one 128-byte swizzle row) along the contiguous dimension.
  static_assert(!kTmaB || (kBK == 64 && kBN % 128 == 0), "TMA B boxes need BK = 64, BN % 128 == 0");
  static_assert(kBM * kBK * int(sizeof(Bf16)) * Pipeline::Stages % 1024 == 0,
                "B stages must start 1024-byte aligned (128-byte swizzle)");

  static constexpr int kProducerThreads = cutlass::NumThreadsPerWarpGroup;
  // Threads of one TiledMma: both consumer warpgroups (cooperative) or one (ping-pong).
  static constexpr int kMmaThreads = cute::size(TiledMma{});
  static constexpr int kConsumerThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  // The dSwiGLU epilogue at BN = 256 only (an opt-in kind): setmaxnreg moves registers from the
  // producer to the consumers, whose 128 fp32 accumulators leave 40 of the launch's 168
  // registers for that epilogue. ptxas (session 31), spill stores without / with: 88 / 12 bytes
  // under config 13, 128 / 0 under config 6, 412 / 96 under config 5, 292 / 208 under config 7.
  // Elsewhere nothing spills at 168, and moving registers made the cp.async producers spill
  // (the SwiGLU kind under config 7: 0 / 260 bytes). The producer of kTmaA is one thread issuing
  // TMA copies; the cp.async producer needs more, the more so when it also copies B.
  static constexpr bool kRegRealloc = kEpi == Epi::kDSwiGLU && kBN == 256;
  static constexpr int kProducerRegs = kTmaA ? 40 : kTmaB ? 56 : 72;
  static constexpr int kConsumerRegs = kTmaA ? 232 : kTmaB ? 224 : 216;
  static_assert(!kRegRealloc || kProducerThreads * kProducerRegs +
                                    kConsumerThreads * kConsumerRegs <= 65536,
                "setmaxnreg: the register file holds 64 K registers");
  static_assert(kEpi != Epi::kDSwiGLU || kMmaThreads == 2 * kBM,
                "prefetch_h: one consumer thread per (row, half)");
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static_assert(kMmaThreads == (kPingpong ? 1 : 2) * cutlass::NumThreadsPerWarpGroup,
                "two consumer warpgroups: one TiledMma, or one each (ping-pong)");
  static_assert(kBK % kChunk == 0 && kProducerThreads % (kBK / kChunk) == 0);
  static_assert(kBN % kChunk == 0 && kProducerThreads % (kBN / kChunk) == 0);

  using Order = MathOrder<kPingpong>;
  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename Order::SharedStorage order;
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));

  struct Params {
    cute::TmaDescriptor tma_b;       // kTmaB: B as 2-D rows (make_tma_b), 64-byte aligned
    cute::TmaDescriptor tma_a;       // kTmaA: src (P, K), boxes of 64 columns x BM rows
    const Bf16* src;                 // (T, K); (P, K) when gather_idx is null
    const int32_t* gather_idx;       // (P,), or null: row p of src
    const Bf16* b;                   // (E, K, ldb) or (E, N, K)
    int64_t b_group_stride;          // elements from B_e to B_{e+1}
    int ldb;                         // row stride of B_e: N (plain NN), 2n (kSwiGLU) or K (NT)
    Out* d;                          // kStore: (P, N)
    Bf16* h_out;                     // kSwiGLU: H (P, 2n), or null (inference: A only)
    Bf16* a_out;                     // kSwiGLU: A (P, n)
    const Bf16* h_in;                // kDSwiGLU: H (P, 2n)
    const float* scores;             // kDSwiGLU: s (P,)
    Bf16* dh_out;                    // kDSwiGLU: dH (P, 2n)
    Bf16* a_prime_out;               // kDSwiGLU: A' (P, n)
    float* ds_part;                  // kDSwiGLU: (P, n_tiles) partial sums of dS
    const int32_t* group_offsets;    // (E + 1,)
    const int32_t* tile_start;       // (E + 1,): first linear tile of each expert, [E] = total
    int num_groups;
    int n;                           // output columns: N (kStore), n (both SwiGLU epilogues)
    int k, n_tiles;
    int64_t src_rows;                // T: gather indices outside [0, T) read as zero rows
    int rows_b;                      // kTmaB: rows of B_e in its TMA view (K if NN, N if NT)
  };

  // One output tile: rows [row0, row0 + rows) of D (all in expert e), columns [n0, n0 + BN).
  // rows is 0 for the second CTA of a cluster whose expert has an odd number of M blocks: it
  // still runs the mainloop (its producer supplies half of the shared B tile) but stores nothing.
  struct TileCoord {
    int e, row0, rows, n0;
  };

  // `tile` counts (expert, cluster M block, N block) triples; `rank` is the CTA in the cluster.
  static __device__ TileCoord locate(const Params& p, int tile, int n_tiles, int rank) {
    // The largest e with tile_start[e] <= tile: empty experts share their successor's start, so
    // this is the one non-empty expert whose range holds the tile.
    int lo = 0, hi = p.num_groups;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (__ldg(p.tile_start + mid) <= tile) lo = mid; else hi = mid;
    }
    const int local = tile - __ldg(p.tile_start + lo);
    const int m_blk = local / n_tiles;  // N blocks vary fastest: neighbouring CTAs share A rows
    const int start = __ldg(p.group_offsets + lo) + (m_blk * kClusterM + rank) * kBM;
    const int end = __ldg(p.group_offsets + lo + 1);
    return {lo, start, max(0, min(kBM, end - start)), (local - m_blk * n_tiles) * kTileN};
  }

  // Producer-side publication of filled stages without kNoinc. A stage's copies are one cp.async
  // group; it is
  // published (full-barrier arrive) once the group after it has been issued, after waiting for
  // it and fencing, so that each thread keeps kLag + 1 stages of copies in flight. kLag must be
  // <= stages - 2: the consumers release stage s only after consuming stage s + 1.
  static constexpr int kLag = 1;
  static_assert(Pipeline::Stages >= kLag + 2, "too few stages for the publication lag");

  struct Publisher {
    PipeState next;   // oldest filled stage not yet published
    int pending = 0;  // filled stages not yet published

    __device__ void filled(Pipeline& pipe) {
      cute::cp_async_fence();  // close this stage's group
      if (++pending > kLag) {
        cute::cp_async_wait<kLag>();             // this thread's copies of `next` landed
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> WGMMA reads
        pipe.producer_commit(next);
        ++next;
        --pending;
      }
    }

    __device__ void flush(Pipeline& pipe) {
      cute::cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();
      for (; pending > 0; --pending, ++next) pipe.producer_commit(next);
    }
  };

  // kTmaB, leader thread: this CTA's half of the stage's B tile by TMA, multicast to both CTAs
  // of the cluster (each CTA's full barrier expects the whole tile). B is a 2-D view with the
  // experts stacked along its rows (make_tma_b); rows or columns past the tensor read as zeros,
  // and rows of the next expert met past K (NN) or N (NT) multiply A's zero-filled K residue or
  // land in accumulator columns that are never stored.
  // Without a cluster (kClusterM == 1) the leader loads both halves into its own stage.
  static __device__ void load_b_tma(const Params& p, const TileCoord& tc, int k0, Bf16* stage_b,
                                    uint64_t* full_barrier, int rank) {
    if constexpr (kClusterM == 1) {
      load_b_half<false>(p, tc, k0, stage_b, full_barrier, 0);
      load_b_half<false>(p, tc, k0, stage_b, full_barrier, 1);
    } else {
      load_b_half<true>(p, tc, k0, stage_b, full_barrier, rank);
    }
  }

  // Half `rank` of the stage's B tile (the columns CTA `rank` of a cluster brings), multicast
  // to both CTAs or into this CTA's stage only.
  template <bool kMulticast>
  static __device__ void load_b_half(const Params& p, const TileCoord& tc, int k0, Bf16* stage_b,
                                     uint64_t* full_barrier, int rank) {
    constexpr uint16_t kBothCtas = 0b11;
    const uint64_t hint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    constexpr int kHalf = kBN / 2;
    auto copy = [&](Bf16* dst, int c0, int c1) {
      if constexpr (kMulticast) {
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(&p.tma_b, full_barrier, kBothCtas, hint, dst, c0,
                                               c1);
      } else {
        cute::SM90_TMA_LOAD_2D::copy(&p.tma_b, full_barrier, hint, dst, c0, c1);
      }
    };
    if constexpr (!kNT) {
      // B_e (K, ldb): boxes of 64 columns x BK rows, one per 64-column block of the stage (the
      // stage stores each such block as BK rows of 128 bytes). kSwiGLU: CTA 0 brings the gate
      // columns, CTA 1 the matching up columns n further right.
      const int row = tc.e * p.rows_b + k0;
      const int col0 = kEpi == Epi::kSwiGLU ? (rank == 0 ? 0 : p.n) + tc.n0 : tc.n0 + rank * kHalf;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kHalf / 64; ++i) {
        copy(stage_b + (rank * kHalf + i * 64) * kBK, col0 + i * 64, row);
      }
    } else {
      // B_e (N, K): one box of BN/2 rows x 64 columns (K-major rows of 128 bytes).
      copy(stage_b + rank * kHalf * kBK, k0, tc.e * p.rows_b + tc.n0 + rank * kHalf);
    }
  }

  // kTmaA, leader thread: one stage per K block, the A box at the tile's first row (rows past
  // the group end belong to the next expert or read as zeros past P: their accumulator rows are
  // never stored) and the B tile; the full barrier expects both (make_pipeline).
  static __device__ void load_tile_tma(const Params& p, const TileCoord& tc, Pipeline& pipe,
                                       PipeState& state, typename Mainloop::TensorStorage& smem,
                                       int k_tiles) {
    const uint64_t hint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    for (int kt = 0; kt < k_tiles; ++kt) {
      pipe.producer_acquire(state);
      const int stage = state.index();
      uint64_t* full = pipe.producer_get_barrier(state);
      const int k0 = kt * kBK;
      cute::SM90_TMA_LOAD_2D::copy(&p.tma_a, full, hint, smem.smem_A.data() + stage * (kBM * kBK),
                                   k0, tc.row0);
      load_b_tma(p, tc, k0, smem.smem_B.data() + stage * (kBN * kBK), full, 0);
      ++state;
    }
  }

  // Producer warpgroup: fills one stage per K block, A through gather_idx, B from B_e.
  static __device__ void load_tile(const Params& p, const TileCoord& tc, Pipeline& pipe,
                                   PipeState& state, Publisher& pub,
                                   typename Mainloop::TensorStorage& smem, int tid, int k_tiles,
                                   int rank) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});

    // A: a thread owns one 16-byte column chunk of every (128 / chunks-per-row)-th row. Source
    // rows are kept as 32-bit indices (-1: zero-fill) so the producer fits in few registers.
    constexpr int kARowChunks = kBK / kChunk;
    constexpr int kARowStep = kProducerThreads / kARowChunks;
    constexpr int kAIters = kBM / kARowStep;
    const int a_col = (tid % kARowChunks) * kChunk;
    const int row_in = tid / kARowChunks;
    int32_t a_src[kAIters];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kAIters; ++i) {
      const int r = row_in + i * kARowStep;
      const int32_t src_row = r >= tc.rows        ? -1
                              : p.gather_idx != nullptr ? __ldg(p.gather_idx + tc.row0 + r)
                                                        : tc.row0 + r;
      a_src[i] = src_row >= 0 && src_row < p.src_rows ? src_row : -1;
    }
    const Bf16* b_e = p.b + int64_t(tc.e) * p.b_group_stride;

    for (int kt = 0; kt < k_tiles; ++kt) {
      pipe.producer_acquire(state);
      const int stage = state.index();
      const int k0 = kt * kBK;
      const bool a_k_ok = k0 + a_col < p.k;
      const Bf16* a_base = p.src + k0 + a_col;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kAIters; ++i) {
        const bool ok = a_k_ok && a_src[i] >= 0;
        const Bf16* g = ok ? a_base + int64_t(a_src[i]) * p.k : p.src;
        cp_async_16(&sA(row_in + i * kARowStep, a_col, stage), g, ok);
      }
      if constexpr (kTmaB) {
        if (tid == 0) {
          load_b_tma(p, tc, k0, smem.smem_B.data() + stage * (kBN * kBK),
                     pipe.producer_get_barrier(state), rank);
        }
      } else if constexpr (kNT) {
        // B_e (N, K): K-major rows like A, no gather.
        constexpr int kBIters = kBN / kARowStep;
        CUTLASS_PRAGMA_UNROLL
        const Bf16* b_base = b_e + int64_t(tc.n0 + row_in) * p.ldb + k0 + a_col;
        const int64_t b_step = int64_t(kARowStep) * p.ldb;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kBIters; ++j) {
          const int c = row_in + j * kARowStep;
          const bool ok = a_k_ok && tc.n0 + c < p.n;
          cp_async_16(&sB(c, a_col, stage), ok ? b_base + j * b_step : p.b, ok);
        }
      } else {
        // B_e (K, N): 16-byte chunks along N, MN-major stage layout.
        constexpr int kBColChunks = kBN / kChunk;
        constexpr int kBKStep = kProducerThreads / kBColChunks;
        constexpr int kBIters = kBK / kBKStep;
        const int c = (tid % kBColChunks) * kChunk;
        const int k_in = tid / kBColChunks;
        // kSwiGLU: stage columns [0, BN/2) are gate columns n0 + c, [BN/2, BN) up columns
        // n + n0 + (c - BN/2) of w1's concat layout.
        const int cc = c % kTileN;
        const bool n_ok = tc.n0 + cc < p.n;
        const int g_col = (kEpi == Epi::kSwiGLU && c >= kTileN ? p.n : 0) + tc.n0 + cc;
        const Bf16* b_base = b_e + int64_t(k0 + k_in) * p.ldb + g_col;
        const int64_t b_step = int64_t(kBKStep) * p.ldb;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kBIters; ++j) {
          const int kk = k_in + j * kBKStep;
          const bool ok = n_ok && k0 + kk < p.k;
          cp_async_16(&sB(c, kk, stage), ok ? b_base + j * b_step : p.b, ok);
        }
      }
      if constexpr (kNoinc) {
        // Arrives once this thread's copies so far have landed; with kTmaB the full barrier also
        // waits for the leader's arrive_and_expect_tx (producer_acquire) and the TMA bytes. Not
        // through producer_commit(state, op): PipelineAsync's also arrives at once after op.
        cutlass::arch::cpasync_barrier_arrive_noinc(pipe.producer_get_barrier(state));
      } else {
        pub.filled(pipe);
      }
      ++state;
    }
  }

  // (row, column) in the tile of each accumulator value of consumer thread `mma_tid`.
  CUTE_HOST_DEVICE static auto tile_coords(int mma_tid) {
    using namespace cute;
    return TiledMma{}.get_slice(mma_tid).partition_C(
        make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{})));
  }

  // Consumer epilogue straight from the accumulators: rows past the group end and columns past
  // N are never written (neighbouring experts own those rows). fp32: a float2 per lane, whole
  // sectors per quad already; bf16: store_quad_16cols (whole sectors, quad_groups_ok).
  template <class Accum>
  static __device__ void store_tile(const Params& p, const TileCoord& tc, const Accum& acc,
                                    int mma_tid) {
    store_acc_tile(p.d + int64_t(tc.row0) * p.n + tc.n0, p.n, tc.rows, p.n - tc.n0,
                   tile_coords(mma_tid), acc, mma_tid);
  }

  // ---- Fused epilogues. Both rely on the WGMMA accumulator layout: each thread's fragment
  // holds pairs of adjacent columns (i, i + 1), two rows r and r + 8, the four lanes of a quad
  // hold the same rows, and (kSwiGLU) the fragment's second half repeats its first half's
  // coordinates BN/2 columns to the right. layout_ok() checks exactly this on the host.

  // H = bf16([gate | up]) and A = silu(g)·u from the bf16-rounded g, u (what the backward
  // recomputes from H), by store_quad_16cols; rows past the group end and columns past n not
  // written.
  template <class Accum>
  static __device__ void store_swiglu(const Params& p, const TileCoord& tc, const Accum& acc,
                                      int mma_tid) {
    using namespace cute;
    Tensor coord = tile_coords(mma_tid);
    constexpr int kHalf = decltype(size(acc))::value / 2;
    static_assert(kHalf % 8 == 0);
    const int64_t two_n = 2 * int64_t(p.n);
    const int n_left = p.n - tc.n0;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kHalf; g += 8) {
      const int r = get<0>(coord(g)), c0 = get<1>(coord(g)) - 2 * (mma_tid & 3);
      uint32_t gw[4], uw[4], aw[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int i = g + 2 * j;
        const __nv_bfloat162 g2 = __floats2bfloat162_rn(acc(i), acc(i + 1));
        const __nv_bfloat162 u2 = __floats2bfloat162_rn(acc(i + kHalf), acc(i + kHalf + 1));
        const float2 gf = __bfloat1622float2(g2), uf = __bfloat1622float2(u2);
        gw[j] = *reinterpret_cast<const uint32_t*>(&g2);
        uw[j] = *reinterpret_cast<const uint32_t*>(&u2);
        aw[j] = pack_bf16x2(swiglu_elem(gf.x, uf.x), swiglu_elem(gf.y, uf.y));
      }
      const int64_t row = tc.row0 + r;
      const bool ok_r = r < tc.rows, ok_r8 = r + 8 < tc.rows;
      if (p.h_out != nullptr) {
        Bf16* h = p.h_out + row * two_n + tc.n0 + c0;
        store_quad_16cols(gw, h, h + 8 * two_n, ok_r, ok_r8, n_left - c0);
        store_quad_16cols(uw, h + p.n, h + p.n + 8 * two_n, ok_r, ok_r8, n_left - c0);
      }
      Bf16* a = p.a_out + row * p.n + tc.n0 + c0;
      store_quad_16cols(aw, a, a + 8 * int64_t(p.n), ok_r, ok_r8, n_left - c0);
    }
  }

  // From dA' (accumulators), H and s: dH (gate: s·dA'·u·σ(g)·(1 + g·(1 − σ(g))), up:
  // s·dA'·silu(g)), A' = s·A and this tile's part of dS = Σ_c dA'·A (fp32), A from the bf16 H.
  // H is read in chunks of kLoadPairs column pairs whose loads are all issued before any of
  // their stores (the compiler cannot move a load past a store that might alias it), after
  // prefetch_h pulled the tile's rows into L2 while the mainloop ran; since session 32 by
  // load_quad_16cols (16-byte loads of whole sectors; before, one 4-byte load per pair).
  // 128 x 256 spilled with 8 at the launch's 168 registers; with kRegRealloc's 224 it spills
  // no more than with 4 (ptxas, session 31).
  static constexpr int kLoadPairs = kBN == 256 && !kRegRealloc ? 4 : 8;
  static_assert(kLoadPairs % 4 == 0, "whole store_quad_16cols groups per chunk");

  static __device__ void prefetch_h(const Params& p, const TileCoord& tc, int mma_tid) {
    // 128 rows x (gate, up) x kTileN bf16 columns: kTileN / 64 lines of 128 bytes per segment.
    constexpr int kLines = kTileN * 2 / 128;
    const int seg = mma_tid;  // kMmaThreads == 2 * kBM segments of (row, half)
    const int r = seg >> 1;
    if (r >= tc.rows) return;
    const Bf16* base = p.h_in + (tc.row0 + r) * 2 * int64_t(p.n) + (seg & 1) * p.n + tc.n0;
    const int cols = min(kTileN, p.n - tc.n0);
    CUTLASS_PRAGMA_UNROLL
    for (int l = 0; l < kLines; ++l) {
      if (l * 64 < cols) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 64));
    }
  }

  template <class Accum>
  static __device__ void store_dswiglu(const Params& p, const TileCoord& tc, const Accum& acc,
                                       int mma_tid) {
    using namespace cute;
    Tensor coord = tile_coords(mma_tid);
    constexpr int kPairs = decltype(size(acc))::value / 2;
    static_assert(kPairs % kLoadPairs == 0);
    const int64_t two_n = 2 * int64_t(p.n);
    const int n_left = p.n - tc.n0;
    const int r_lo = get<0>(coord(0));  // this thread's rows: r_lo and r_lo + 8
    const bool ok_lo = r_lo < tc.rows, ok_hi = r_lo + 8 < tc.rows;
    const float s_lo = ok_lo ? __ldg(p.scores + tc.row0 + r_lo) : 0.0f;
    const float s_hi = ok_hi ? __ldg(p.scores + tc.row0 + r_lo + 8) : 0.0f;
    Bf16* const dh_row = p.dh_out + (tc.row0 + r_lo) * two_n + tc.n0;  // (r_lo, n0) of dH
    Bf16* const ap_row = p.a_prime_out + (tc.row0 + r_lo) * int64_t(p.n) + tc.n0;
    const Bf16* const h_row = p.h_in + (tc.row0 + r_lo) * two_n + tc.n0;  // (r_lo, n0) of H
    float dot_lo = 0.0f, dot_hi = 0.0f;
    CUTLASS_PRAGMA_UNROLL
    for (int q0 = 0; q0 < kPairs; q0 += kLoadPairs) {
      // H's gate and up pairs of the chunk in fragment order, by 16-byte loads of whole
      // sectors (load_quad_16cols: pairs j .. j + 3 are one group; zeros where masked).
      uint32_t gw[kLoadPairs], uw[kLoadPairs];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kLoadPairs; j += 4) {
        const int c0 = get<1>(coord(2 * (q0 + j))) - 2 * (mma_tid & 3);
        const Bf16* hg = h_row + c0;
        uint32_t g4[4], u4[4];
        load_quad_16cols(hg, hg + 8 * two_n, ok_lo, ok_hi, n_left - c0, g4);
        load_quad_16cols(hg + p.n, hg + p.n + 8 * two_n, ok_lo, ok_hi, n_left - c0, u4);
        CUTLASS_PRAGMA_UNROLL
        for (int jj = 0; jj < 4; ++jj) {
          gw[j + jj] = g4[jj];
          uw[j + jj] = u4[jj];
        }
      }
      // Pairs j, j + 1, j + 2, j + 3 of a chunk are one store_quad_16cols group (kLoadPairs
      // % 4 == 0, quad_groups_ok): (r_lo, c0 + 2q), (r_lo + 8, ..), then 8 columns right.
      uint32_t dgw[kLoadPairs], duw[kLoadPairs], apw[kLoadPairs];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kLoadPairs; ++j) {
        const int i = 2 * (q0 + j);
        const int r = get<0>(coord(i)), c = get<1>(coord(i));
        const bool lo = r == r_lo;
        float gs[2], us[2];
        unpack_bf16x2(gw[j], gs);
        unpack_bf16x2(uw[j], us);
        const float ds[2] = {acc(i), acc(i + 1)};
        float dg[2], du[2], ap[2];
        // Masked pairs read H as zeros and have s = 0 past the group: finite, never stored.
        const float dot = dswiglu_n<2>(gs, us, ds, lo ? s_lo : s_hi, dg, du, ap);
        if (r < tc.rows && c < n_left) {
          if (lo) dot_lo += dot; else dot_hi += dot;
        }
        dgw[j] = pack_bf16x2(dg[0], dg[1]);
        duw[j] = pack_bf16x2(du[0], du[1]);
        apw[j] = pack_bf16x2(ap[0], ap[1]);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kLoadPairs; j += 4) {
        const int c0 = get<1>(coord(2 * (q0 + j))) - 2 * (mma_tid & 3);
        const uint32_t g4[4] = {dgw[j], dgw[j + 1], dgw[j + 2], dgw[j + 3]};
        const uint32_t u4[4] = {duw[j], duw[j + 1], duw[j + 2], duw[j + 3]};
        const uint32_t a4[4] = {apw[j], apw[j + 1], apw[j + 2], apw[j + 3]};
        Bf16* dh = dh_row + c0;
        store_quad_16cols(g4, dh, dh + 8 * two_n, ok_lo, ok_hi, n_left - c0);
        store_quad_16cols(u4, dh + p.n, dh + p.n + 8 * two_n, ok_lo, ok_hi, n_left - c0);
        Bf16* ap = ap_row + c0;
        store_quad_16cols(a4, ap, ap + 8 * int64_t(p.n), ok_lo, ok_hi, n_left - c0);
      }
    }
    // The quad (lanes 4q .. 4q + 3) holds every column of rows r_lo and r_lo + 8.
    dot_lo += __shfl_xor_sync(0xffffffffu, dot_lo, 1);
    dot_lo += __shfl_xor_sync(0xffffffffu, dot_lo, 2);
    dot_hi += __shfl_xor_sync(0xffffffffu, dot_hi, 1);
    dot_hi += __shfl_xor_sync(0xffffffffu, dot_hi, 2);
    if ((mma_tid & 3) == 0) {
      const int nt = tc.n0 / kTileN;
      if (r_lo < tc.rows) p.ds_part[(tc.row0 + r_lo) * int64_t(p.n_tiles) + nt] = dot_lo;
      if (r_lo + 8 < tc.rows) p.ds_part[(tc.row0 + r_lo + 8) * int64_t(p.n_tiles) + nt] = dot_hi;
    }
  }

  // Host check of the accumulator layout the fused epilogues assume (see above).
  static bool layout_ok() {
    using namespace cute;
    constexpr int kSize = decltype(size(tile_coords(0)))::value;
    for (int t = 0; t < kMmaThreads; ++t) {
      auto coord = tile_coords(t);
      auto quad0 = tile_coords(t & ~3);
      const int r_lo = get<0>(coord(0));
      if (get<0>(quad0(0)) != r_lo) return false;
      for (int i = 0; i < kSize; ++i) {
        const int r = get<0>(coord(i)), c = get<1>(coord(i));
        if (r != r_lo && r != r_lo + 8) return false;
        if (i % 2 == 0 && (c % 2 != 0 || get<0>(coord(i + 1)) != r ||
                           get<1>(coord(i + 1)) != c + 1)) {
          return false;
        }
        if (kEpi == Epi::kSwiGLU && i < kSize / 2 &&
            (c >= kTileN || get<0>(coord(i + kSize / 2)) != r ||
             get<1>(coord(i + kSize / 2)) != c + kTileN)) {
          return false;
        }
      }
    }
    return true;
  }

  // kTmaB: where the TMA boxes of load_b_tma land must be where SmemLayoutB (which the WGMMA
  // descriptors follow) puts each (n, k, stage) element, 128-byte swizzle included: TMA's
  // swizzle XORs the 16-byte chunk index of an address with its 128-byte row index mod 8.
  static bool tma_b_layout_ok() {
    using namespace cute;
    if constexpr (!kTmaB) {
      return true;
    } else {
      return stage_layout_is<SmemLayoutB>(kBN, kBK, Pipeline::Stages, [](int n, int k) {
        return kNT ? (n / (kBN / 2)) * (kBN / 2) * kBK + tma_swizzle_128b(k + 64 * (n % (kBN / 2)))
                   : (n / 64) * 64 * kBK + tma_swizzle_128b(n % 64 + 64 * k);
      });
    }
  }

  // kTmaA: as tma_b_layout_ok for the A boxes (64 K columns x BM rows, K-major).
  static bool tma_a_layout_ok() {
    if constexpr (!kTmaA) {
      return true;
    } else {
      return stage_layout_is<SmemLayoutA>(kBM, kBK, Pipeline::Stages, [](int m, int k) {
        return tma_swizzle_128b(k + 64 * m);
      });
    }
  }

  // Every host layout check that applies to this instantiation (Launcher::run, all_layouts_ok
  // and the plain kinds' checks of config 14).
  static bool layouts_ok() {
    // quad_groups_ok: store_quad_16cols's groups, and the (c, c + 1) pairs of the fp32 store.
    return (!kFused || layout_ok()) && tma_b_layout_ok() && tma_a_layout_ok() &&
           quad_groups_ok<TiledMma, kBM, kBN>();
  }

  // kNoinc consumers: CUTLASS's `mma` has no place for the proxy fence the noinc publication
  // needs (the producer thread cannot fence copies it never waits for), so this is the same
  // WGMMA loop with it: wait for stage s, fence, issue its wgmmas, then release stage s - 1 once
  // its wgmmas completed (one batch in flight). Advances `rd` by k_tiles. `issued()` runs once
  // every wgmma is issued, before the wait for the last ones (ping-pong's MathOrder::arrive,
  // where CUTLASS's ping-pong kernel cues the other warpgroup).
  template <class Accum, class Issued>
  static __device__ void consume(Pipeline& pipe, PipeState& rd, Accum& acc, int k_tiles,
                                 int mma_tid, typename Mainloop::TensorStorage& smem,
                                 Issued issued) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});
    TiledMma mma;
    const int wg = __shfl_sync(0xffffffffu, mma_tid / cutlass::NumThreadsPerWarpGroup, 0);
    auto thr = mma.get_slice(wg * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, M, K, stages) descriptors
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    PipeState release = rd;
    warpgroup_fence_operand(acc);
    for (int kt = 0; kt < k_tiles; ++kt) {
      pipe.consumer_wait(rd);
      // cp.async writes (generic proxy) -> wgmma reads; TMA writes are async-proxy already.
      if constexpr (!kTmaA) cutlass::arch::fence_view_async_shared();
      const int s = rd.index();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        mma.accumulate_ = kt == 0 && kb == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        cute::gemm(mma, tCrA(_, _, kb, s), tCrB(_, _, kb, s), acc);
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      if (kt > 0) {
        pipe.consumer_release(release);
        ++release;
      }
      ++rd;
    }
    issued();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    pipe.consumer_release(release);
  }

  // Consumer counts are one TiledMma's threads: under ping-pong a stage is consumed and
  // released by one warpgroup.
  static __device__ Pipeline make_pipeline(SharedStorage& smem, int wg) {
    typename Pipeline::Params pp;
    pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    if constexpr (kTmaA) {
      pp.is_leader = threadIdx.x == 0;
      pp.num_consumers = kMmaThreads;
      pp.num_producers = 1;  // the leader's arrive_and_expect_tx only
      pp.transaction_bytes = kAStageBytes + kBStageBytes;
      return Pipeline(smem.pipeline, pp, cute::Shape<cute::_1, cute::_1, cute::_1>{});
    } else if constexpr (kTmaB) {
      pp.is_leader = threadIdx.x == 0;
      pp.num_consumers = kMmaThreads;
      // Every producer thread arrives once its A copies landed (noinc), the leader once more
      // with the expected bytes: both halves of the B tile land in each CTA of the cluster.
      pp.num_producers = kProducerThreads + 1;  // noinc arrivals + the leader's expect_tx
      pp.transaction_bytes = kBStageBytes;
      return Pipeline(smem.pipeline, pp, cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>{});
    } else {
      pp.producer_arv_count = kProducerThreads;
      pp.consumer_arv_count = kMmaThreads;
      return Pipeline(smem.pipeline, pp);
    }
  }

  static __device__ void run(const Params& p, char* smem_buf) {
    using namespace cute;
    auto& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int wg = cutlass::canonical_warp_group_idx();

    Pipeline pipe = make_pipeline(smem, wg);
    Order order(smem.order, wg > 0 ? wg - 1 : 0);
    int rank = 0;
    if constexpr (kClusterM == 2) {
      rank = static_cast<int>(cute::block_rank_in_cluster());
      // Both CTAs' barriers initialised before any multicast or remote arrival reaches them.
      cute::cluster_sync();
    } else {
      __syncthreads();  // barrier initialisation visible to every warpgroup
    }

    const int n_tiles = p.n_tiles;
    const int k_tiles = (p.k + kBK - 1) / kBK;
    const int total = __ldg(p.tile_start + p.num_groups);
    // Both CTAs of a cluster walk the same tiles (they differ in M block only).
    const int first = blockIdx.x / kClusterM, step = gridDim.x / kClusterM;

    if (wg == 0) {
      if constexpr (kRegRealloc) cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      PipeState state = cutlass::make_producer_start_state<Pipeline>();
      Publisher pub{state};
      const int tid = threadIdx.x;
      if constexpr (kTmaB) {
        if (tid == 0) cute::prefetch_tma_descriptor(&p.tma_b);
      }
      if constexpr (kTmaA) {
        // One thread issues every copy; the rest of the warpgroup has nothing to do.
        if (tid == 0) {
          cute::prefetch_tma_descriptor(&p.tma_a);
          for (int tile = first; tile < total; tile += step) {
            load_tile_tma(p, locate(p, tile, n_tiles, rank), pipe, state, smem.tensors, k_tiles);
          }
          pipe.producer_tail(state);
        }
      } else {
        for (int tile = first; tile < total; tile += step) {
          load_tile(p, locate(p, tile, n_tiles, rank), pipe, state, pub, smem.tensors, tid,
                    k_tiles, rank);
        }
        if constexpr (!kNoinc) pub.flush(pipe);
        // The consumers (of both CTAs, with kTmaB) release every stage before the CTA exits.
        pipe.producer_tail(state);
      }
    } else {
      if constexpr (kRegRealloc) cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      PipeState state;
      // Ping-pong: this warpgroup's thread index within its own TiledMma; the cooperative
      // TiledMma spans both consumer warpgroups.
      const int consumer = wg - 1;
      const int mma_tid = threadIdx.x - kProducerThreads -
                          (kPingpong ? consumer * cutlass::NumThreadsPerWarpGroup : 0);
      int turn = 0;  // this CTA's tiles so far
      for (int tile = first; tile < total; tile += step, ++turn) {
        if constexpr (kPingpong) {
          // The other warpgroup's tile: its k_tiles stages are not ours.
          if ((turn & 1) != consumer) {
            state.advance(k_tiles);
            continue;
          }
        }
        auto acc = partition_fragment_C(TiledMma{}, take<0, 2>(Tile{}));
        if constexpr (kEpi == Epi::kDSwiGLU) {
          prefetch_h(p, locate(p, tile, n_tiles, rank), mma_tid);
        }
        if constexpr (kNoinc) {
          order.wait();
          consume(pipe, state, acc, k_tiles, mma_tid, smem.tensors, [&] { order.arrive(); });
        } else {
          Mainloop mainloop;
          const typename Mainloop::Params unused{};  // the consumer half reads no parameter
          mainloop.mma(pipe, state, acc, k_tiles, mma_tid, smem.tensors, unused);
          mainloop.mma_tail(pipe, state, k_tiles);
          state.advance(k_tiles);
        }
        // Only the epilogue needs the tile's rows: locate it after the mainloop started.
        const TileCoord tc = locate(p, tile, n_tiles, rank);
        if constexpr (kEpi == Epi::kStore) {
          store_tile(p, tc, acc, mma_tid);
        } else if constexpr (kEpi == Epi::kSwiGLU) {
          store_swiglu(p, tc, acc, mma_tid);
        } else {
          store_dswiglu(p, tc, acc, mma_tid);
        }
      }
    }
  }
};

template <class G>
__global__ void __launch_bounds__(G::kThreads, 1)
    gather_gemm_kernel(const __grid_constant__ typename G::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem_buf[];
  G::run(p, smem_buf);
#endif
}

// tile_start[e] = Σ_{g<e} ceil(rows_g / bm) · n_tiles, tile_start[E] = total; one block.
constexpr int kScanThreads = 256;
static __global__ void __launch_bounds__(kScanThreads)
    tile_prefix_kernel(const int32_t* offsets, int num_groups, int bm, int n_tiles,
                       int32_t* tile_start) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int32_t carry = 0;
  for (int base = 0; base < num_groups; base += kScanThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int32_t tiles = 0;
    if (e < num_groups) {
      const int32_t rows = max(offsets[e + 1] - offsets[e], 0);
      tiles = (rows + bm - 1) / bm * n_tiles;
    }
    int32_t before, chunk_total;
    Scan(tmp).ExclusiveSum(tiles, before, chunk_total);
    if (e < num_groups) tile_start[e] = carry + before;
    carry += chunk_total;
    __syncthreads();  // TempStorage is reused by the next chunk
  }
  if (threadIdx.x == 0) tile_start[num_groups] = carry;
}

constexpr size_t kWsAlign = 256;

// SMs of the current device, queried once per device (the persistent grid size).
inline int sm_count() {
  int device = 0;
  cudaGetDevice(&device);
  static thread_local int cached_device = -1, cached_sms = 0;
  if (device != cached_device) {
    cudaDeviceGetAttribute(&cached_sms, cudaDevAttrMultiProcessorCount, device);
    cached_device = device;
  }
  return cached_sms > 0 ? cached_sms : 1;
}

// A 2-D bf16 tensor map of `rows` rows of `cols` elements (rows 16-byte aligned), boxes of 64
// columns x box_rows rows, 128-byte swizzle, zeros read past the tensor.
inline std::string encode_tma_2d(const void* base, uint64_t cols, uint64_t rows,
                                 uint32_t box_rows, cute::TmaDescriptor* out, const char* what) {
  cuuint64_t dims[2] = {cols, rows};
  cuuint64_t row_bytes[1] = {cols * sizeof(Bf16)};
  cuuint32_t box[2] = {64, box_rows};
  cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, row_bytes, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return std::string(what) + " failed: " + std::to_string(int(r));
  return {};
}

// Launches the persistent `kernel` on clusters of `cluster` CTAs along x: as many clusters as
// can be resident at once (not every SM pairs up within its GPC; a cluster that waited for a
// free pair would run after the others' tiles), at most max_clusters. The count is queried once
// per device and kernel (host work only, no stream operation). `what` prefixes errors.
template <class Kernel, class Params>
std::string launch_on_clusters(Kernel kernel, const Params& kp, int cluster, int threads,
                               int smem_bytes, int64_t max_clusters, cudaStream_t stream,
                               const char* what) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int device = 0;
  cudaGetDevice(&device);
  static thread_local int cached_device = -1, cached_clusters = 0;
  if (device != cached_device) {
    cfg.gridDim = dim3(sm_count());
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&cached_clusters, kernel, &cfg);
    if (err != cudaSuccess || cached_clusters < 1) {
      return std::string("cudaOccupancyMaxActiveClusters: ") +
             (err != cudaSuccess ? cudaGetErrorString(err) : "no cluster fits");
    }
    cached_device = device;
  }
  const int64_t clusters = max_clusters < cached_clusters ? max_clusters : cached_clusters;
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * cluster));
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, kp);
  if (err != cudaSuccess) return std::string(what) + ": " + cudaGetErrorString(err);
  return {};
}

// fn(G<tile schedule>{}) for a gather config (sonic::GemmConfig 4 to 7, 13, 15, 16); false for
// another. G is
// a Launcher template of one kind; every gathered and fused-epilogue kind builds both schedules.
template <template <class> class G, class Fn>
inline bool dispatch_config(int config, Fn fn) {
  switch (config) {
    case 4: fn(G<GatherCoop128x128>{}); return true;
    case 5: fn(G<GatherCoop128x256>{}); return true;
    case 6: fn(G<GatherTmaB128x256C2x1>{}); return true;
    case 7: fn(G<GatherNoinc128x256>{}); return true;
    case 13: fn(G<GatherTmaB128x256C1>{}); return true;
    case 15: fn(G<GatherPingpong64x256C2x1>{}); return true;
    case 16: fn(G<GatherPingpong64x256C1>{}); return true;
    default: return false;
  }
}

// Host check of every schedule's layout assumptions (the fused epilogues' accumulator layout,
// the TMA boxes of kTmaB) for the kinds whose Launcher templates are Gs.
template <template <class> class... Gs>
inline bool all_layouts_ok() {
  bool ok = true;
  auto check = [&](auto g) {
    ok = ok && decltype(g)::Gemm::layouts_ok();
  };
  for (int config = 0; config < static_cast<int>(GemmConfig::kNumConfigs); ++config) {
    (dispatch_config<Gs>(config, check), ...);
  }
  return ok;
}

template <class G>
struct Launcher {
  using Gemm = G;
  static size_t workspace_bytes(int e) {
    return (size_t(e + 1) * sizeof(int32_t) + kWsAlign - 1) / kWsAlign * kWsAlign;
  }

  static std::string run(const GroupedGemmParams& p, cudaStream_t stream) {
    if (p.num_groups < 1) return "need at least one group";
    if (p.workspace_bytes < workspace_bytes(p.num_groups)) {
      return "workspace too small: " + std::to_string(p.workspace_bytes) + " < " +
             std::to_string(workspace_bytes(p.num_groups)) + " bytes";
    }
    // Checked once per instantiation: a CUTLASS layout change must not silently mix columns.
    static const bool layout_checked = G::layouts_ok();
    if (!layout_checked) return "shared-memory or accumulator layout differs from what it needs";
    auto* tile_start = static_cast<int32_t*>(p.workspace);
    const int n_tiles = (p.n + G::kTileN - 1) / G::kTileN;
    // With a cluster, one tile index covers kClusterM neighbouring M blocks.
    tile_prefix_kernel<<<1, kScanThreads, 0, stream>>>(p.group_offsets, p.num_groups,
                                                       G::kBM * G::kClusterM, n_tiles, tile_start);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return std::string("tile prefix kernel: ") + cudaGetErrorString(err);

    typename G::Params kp{};
    kp.src = static_cast<const Bf16*>(p.a);
    kp.gather_idx = p.gather_idx;
    kp.b = static_cast<const Bf16*>(p.b);
    kp.d = static_cast<typename G::OutType*>(p.d);
    kp.h_out = static_cast<Bf16*>(p.h_out);
    kp.a_out = static_cast<Bf16*>(p.a_out);
    kp.h_in = static_cast<const Bf16*>(p.h_in);
    kp.scores = p.scores;
    kp.dh_out = static_cast<Bf16*>(p.dh_out);
    kp.a_prime_out = static_cast<Bf16*>(p.a_prime_out);
    kp.ds_part = p.ds_part;
    kp.group_offsets = p.group_offsets;
    kp.tile_start = tile_start;
    kp.num_groups = p.num_groups;
    kp.n = p.n;
    kp.k = p.k;
    kp.n_tiles = n_tiles;
    kp.src_rows = p.src_rows;
    // B_e: (K, N) for plain NN, (K, 2n) for kSwiGLU (w1), (N, K) for NT.
    const int b_cols = G::kNTLayout ? p.k : (G::kEpilogue == Epi::kSwiGLU ? 2 * p.n : p.n);
    kp.ldb = b_cols;
    kp.b_group_stride = int64_t(p.k) * (G::kNTLayout ? p.n : b_cols);
    kp.rows_b = G::kNTLayout ? p.n : p.k;
    if constexpr (G::kTmaB) {
      std::string tma_err = make_tma_b(p, b_cols, &kp.tma_b);
      if (!tma_err.empty()) return tma_err;
    }
    if constexpr (G::kTmaA) {
      if (p.gather_idx != nullptr) return "A by TMA reads rows in order: no gather indices";
      if (p.src_rows < 1) return "A by TMA needs the rows of A (src_rows)";
      std::string tma_err = encode_tma_2d(p.a, p.k, uint64_t(p.src_rows), G::kBM, &kp.tma_a,
                                          "cuTensorMapEncodeTiled for A");
      if (!tma_err.empty()) return tma_err;
    }

    auto kernel = gather_gemm_kernel<G>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               G::kSmemBytes);
    if (err != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err);
    if constexpr (G::kClusterM == 1) {
      // Persistent: one CTA per SM (the stages fill shared memory); CTAs past the last tile exit.
      kernel<<<sm_count(), G::kThreads, G::kSmemBytes, stream>>>(kp);
    } else {
      std::string launch_err =
          launch_on_clusters(kernel, kp, G::kClusterM, G::kThreads, G::kSmemBytes, INT64_MAX,
                             stream, "gather GEMM launch");
      if (!launch_err.empty()) return launch_err;
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return std::string("gather GEMM launch: ") + cudaGetErrorString(err);
    return {};
  }

  // kTmaB: the TMA descriptor of B with the experts stacked along the rows. NN (B_e (K, ldb),
  // ldb = N or w1's 2n): E·K rows of ldb columns, boxes of 64 columns x BK rows. NT (B_e (N, K)):
  // E·N rows of K columns, boxes of 64 columns x BN/2 rows. Rows are 16-byte aligned since
  // K, N and n are multiples of 8 (validated by the handlers).
  static std::string make_tma_b(const GroupedGemmParams& p, int ldb, cute::TmaDescriptor* out) {
    return encode_tma_2d(p.b, G::kNTLayout ? p.k : ldb,
                         uint64_t(p.num_groups) * (G::kNTLayout ? p.n : p.k),
                         G::kNTLayout ? G::kBN / 2 : G::kBK, out, "cuTensorMapEncodeTiled for B");
  }
};

}  // namespace gather
}  // namespace sonic
