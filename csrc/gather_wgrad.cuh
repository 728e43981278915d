// Varlen-K grouped GEMM (the weight gradients) whose operand rows may be read through a row
// index inside the mainloop, so that no (P, d) gathered copy of x or dO is made:
//   D_e (M, N) = Σ_{p in group e} A[ia(p), :]ᵀ ⊗ B[ib(p), :],  p in [group_offsets[e], [e+1]),
// with ia = a_idx (or the identity when a_idx is null) and ib likewise. dW1_e = x[idx]ᵀ · dH
// (A = x gathered, M = d, N = 2n) and dW2_e = A'ᵀ · dO[idx] (B = dO gathered, M = n, N = d).
// The reduction runs over each group's rows, so both operands are MN-major in shared memory
// (M or N contiguous): one producer warpgroup moves 16-byte chunks of 8 M (N) columns of one row
// with cp.async (zero-fill past the group end, past M / N, and for indices outside the source)
// into the stages of CUTLASS's cp.async GMMA mainloop, whose `mma` runs on two consumer
// warpgroups, as gather_gemm.cuh does for the varlen-M kinds (same publication: LagPublisher).
// Tiles are (expert, M block, N block) with N blocks fastest and experts slowest, so the CTAs
// running at once share one expert's rows in L2; a persistent grid walks them. Empty experts
// (no rows) store zeros without a mainloop. Deterministic: one CTA owns each output tile.
//
// Schedules: config 5 (GatherCoop128x256), both operands by cp.async as above; configs 6
// (GatherTmaB128x256C2x1) and 8 (GatherTma256x128C2x1, the wide side on M: dW2's gathered dO
// rows are then re-read by n / 256 M blocks rather than n / 128) load the operand that is not
// gathered (kTmaSide: B for dW1's dH, A for dW2's A') by TMA multicast over a 2-CTA cluster
// whose CTAs take neighbouring blocks of the other operand (M blocks when B is shared, N
// blocks when A is) of one expert, so each reads
// half of the shared tile from L2; the gathered operand by cp.async published with noinc
// arrivals, as gather_gemm.cuh's kTmaB schedule. TMA cannot stop at the group end: the last K
// block of a group also brings the rows after it (the next group's, finite, or token-rounding
// padding, which may hold anything), so before that block's wgmmas the consumers overwrite the
// TMA operand's rows past the group end with zeros (the gathered operand's are zero-filled by
// cp.async; 0 · NaN would be NaN).
#pragma once

#include "gather_gemm.cuh"

namespace sonic {
namespace gather {

// Publication of filled cp.async stages as GatherGemm::Publisher does it (kept separate: moving
// that one out of GatherGemm changed ptxas' register allocation of the gather kernels, which
// then spilled): a stage is published kLag stages after it was issued, once this thread's
// copies of it landed and were fenced against the async proxy.
template <class Pipeline, class PipeState, int kLag>
struct LagPublisher {
  PipeState next;   // oldest filled stage not yet published
  int pending = 0;  // filled stages not yet published

  __device__ void filled(Pipeline& pipe) {
    cute::cp_async_fence();
    if (++pending > kLag) {
      cute::cp_async_wait<kLag>();
      cutlass::arch::fence_view_async_shared();
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

// Rows of the gathered operands' index staged in shared memory per chunk (GatherWgrad::RowStager):
// kIdxChunk rows (16 K blocks of 64) per buffer, two buffers per operand, two operands.
constexpr int kIdxChunk = 1024;
constexpr int kIdxBytes = 2 * 2 * kIdxChunk * int(sizeof(int32_t));

// The CUTLASS collective whose stage layouts, pipeline and (cp.async) consumer half the kernel
// uses: MN-major A (ColumnMajor (M, K)) and B (RowMajor (K, N)); the TMA one of a 2-CTA cluster
// with kTma (its PipelineTmaAsync releases a stage to both CTAs' producers; the cluster is
// launched along x whichever operand the two CTAs share).
template <bool kTma, class Tile, int kCluster>
struct WgradMainloopOf {
  using type = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t,
      cutlass::layout::ColumnMajor, 8, cutlass::bfloat16_t, cutlass::layout::RowMajor, 8, float,
      Tile, cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<1024 + kIdxBytes>,
      cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>::CollectiveOp;
};
template <class Tile, int kCluster>
struct WgradMainloopOf<true, Tile, kCluster> {
  using type = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t,
      cutlass::layout::ColumnMajor, 8, cutlass::bfloat16_t, cutlass::layout::RowMajor, 8, float,
      Tile, cute::Shape<cute::Int<kCluster>, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<1024 + kIdxBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
};

// Config 9 (gathered varlen-K only): as config 8 (256 x 128) without the cluster: each CTA
// loads its whole tile of the TMA operand (twice the L2 reads of that operand) and no CTA waits
// for its partner's gathered rows before a stage is full. Session 22's Nsight Compute source
// view of config 8 (dW2) put 27 % of the warp samples on the consumers' wait for a full stage.
struct GatherTma256x128C1 {
  using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
  static constexpr bool kTmaB = true, kNoinc = true;
  static constexpr int kCluster = 1;
};

// kTmaSide: 0 (config 5: both operands by cp.async), 1 (configs 6, 8, 9, A by TMA: a_idx must
// be null), 2 (configs 6, 8, 9, B by TMA: b_idx must be null) or 3 (config 14, the plain
// varlen-K kind: both by TMA, neither gathered, no cluster; only the producer's leader thread
// issues copies, and the consumers zero both operands' rows past the group end).
template <class Out, class Config, int kTmaSide>
struct GatherWgrad {
  using Tile = typename Config::Tile;
  using OutType = Out;
  static constexpr bool kTmaAB = kTmaSide == 3;
  static constexpr bool kTmaA = kTmaSide == 1 || kTmaAB, kTmaB = kTmaSide == 2 || kTmaAB;
  static constexpr bool kTma = kTmaSide != 0;
  static_assert(Config::kTmaB == kTma && Config::kNoinc == kTma,
                "cp.async with a lag (config 5) or one operand by TMA, noinc arrivals (6)");
  // CTAs sharing the TMA operand's tile: 2 (multicast) unless the config says 1 (config 9:
  // each CTA loads the whole tile, so no CTA waits for its partner's gathered rows).
  static constexpr int kCluster = kTma ? GatherClusterOf<Config>::value : 1;
  static_assert(kCluster == 1 || kCluster == 2, "one CTA or a pair per TMA tile");
  static_assert(!kTmaAB || kCluster == 1, "both operands by TMA: no cluster");
  static constexpr int kBM = cute::size<0>(Tile{});
  static constexpr int kBN = cute::size<1>(Tile{});
  static constexpr int kBK = cute::size<2>(Tile{});
  static constexpr int kChunk = 8;  // bf16 elements per 16-byte cp.async
  using Mainloop = typename WgradMainloopOf<kTma, Tile, kCluster>::type;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipeState = typename Mainloop::PipelineState;
  using SmemLayoutA = typename Mainloop::SmemLayoutA;  // (BM, BK, stages), M contiguous
  using SmemLayoutB = typename Mainloop::SmemLayoutB;  // (BN, BK, stages), N contiguous
  static constexpr int kLag = 1;
  static_assert(Pipeline::Stages >= kLag + 2, "too few stages for the publication lag");
  using Publisher = LagPublisher<Pipeline, PipeState, kLag>;

  static constexpr int kProducerThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kMmaThreads = cute::size(TiledMma{});
  static_assert(kMmaThreads == 2 * cutlass::NumThreadsPerWarpGroup, "two consumer warpgroups");
  static constexpr int kThreads = kProducerThreads + kMmaThreads;
  // A thread owns one 16-byte chunk column of every (128 / chunks-per-row)-th row of a stage.
  static constexpr int kAChunks = kBM / kChunk, kAStep = kProducerThreads / kAChunks;
  static constexpr int kBChunks = kBN / kChunk, kBStep = kProducerThreads / kBChunks;
  static_assert(kProducerThreads % kAChunks == 0 && kBK % kAStep == 0);
  static_assert(kProducerThreads % kBChunks == 0 && kBK % kBStep == 0);
  static constexpr int kAIters = kBK / kAStep, kBIters = kBK / kBStep;
  // The TMA operand's tile: kTmaWidth columns (M or N) x BK rows, 64-column boxes, half per CTA
  // (kTmaAB: both operands' tiles).
  static constexpr int kTmaWidth = kTmaAB ? kBM + kBN : kTmaA ? kBM : kBN;
  static constexpr int kTmaBytes = kTmaWidth * kBK * int(sizeof(Bf16));
  static_assert(!kTma || (kBK == 64 && kBM % 128 == 0 && kBN % 128 == 0),
                "TMA boxes need BK = 64 and a tile width that splits into 64-column halves");
  static_assert(kBM * kBK * int(sizeof(Bf16)) * Pipeline::Stages % 1024 == 0,
                "B stages must start 1024-byte aligned (128-byte swizzle)");

  static constexpr int kBlocksPerChunk = kIdxChunk / kBK;
  static constexpr int kIdxPerThread = kIdxChunk / kProducerThreads;
  static_assert(kIdxChunk % kBK == 0 && kIdxChunk % kProducerThreads == 0);

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    // [operand A / B][buffer][row of the chunk]: source row offsets in 16-byte units.
    uint32_t rows[2][2][kIdxChunk];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));

  struct Params {
    cute::TmaDescriptor tma;       // kTma: a (a_rows, M) or b (b_rows, N) as a 2-D tensor
    cute::TmaDescriptor tma_b;     // kTmaAB: b (b_rows, N); `tma` is a
    const Bf16* a;                 // (a_rows, M)
    const int32_t* a_idx;          // (P,) or null: row p of a
    const Bf16* b;                 // (b_rows, N)
    const int32_t* b_idx;          // (P,) or null: row p of b
    Out* d;                        // (E, M, N)
    const int32_t* group_offsets;  // (E + 1,)
    int num_groups, m, n, m_tiles, n_tiles;
    int m_units, n_units;          // tile units per expert: kTmaB pairs M blocks, kTmaA N blocks
    int64_t a_rows, b_rows;        // indices outside [0, rows) read as zero rows
  };

  struct TileCoord {
    int e, m0, n0, row_begin, row_end;
  };

  // `tile` counts (expert, M unit, N unit) triples; with kTmaB CTA `rank` of a cluster takes M
  // block 2 · unit + rank, with kTmaA N block 2 · unit + rank (past M or N when the count is
  // odd: it loads its half of the shared tile, zero-fills its own operand and stores nothing).
  static __device__ TileCoord locate(const Params& p, int tile, int rank) {
    const int per_expert = p.m_units * p.n_units;
    const int e = tile / per_expert, local = tile - e * per_expert;
    const int um = local / p.n_units, un = local - um * p.n_units;
    constexpr bool kPairM = kTmaB && kCluster == 2, kPairN = kTmaA && kCluster == 2;
    const int m_blk = kPairM ? 2 * um + rank : um, n_blk = kPairN ? 2 * un + rank : un;
    return {e, m_blk * kBM, n_blk * kBN, __ldg(p.group_offsets + e),
            __ldg(p.group_offsets + e + 1)};
  }

  static __device__ int k_tiles_of(const TileCoord& tc) {
    return max(tc.row_end - tc.row_begin, 0) / kBK +
           (max(tc.row_end - tc.row_begin, 0) % kBK != 0 ? 1 : 0);
  }

  // Source row of grouped row `row` (-1: zero-fill): past the group end, or an index outside
  // the source.
  static __device__ __forceinline__ int64_t src_row(const int32_t* idx, int64_t rows, int row,
                                                    int row_end) {
    if (row >= row_end) return -1;
    const int64_t r = idx != nullptr ? __ldg(idx + row) : row;
    return r >= 0 && r < rows ? r : -1;
  }

  // Staged row of a zero-filled chunk (past the group end, or an index outside the source).
  static constexpr uint32_t kNoRow = 0xffffffffu;

  // One gathered operand's source rows, kIdxChunk grouped rows at a time, in shared memory, as
  // offsets in 16-byte units (row · ld / 8; the launcher checks that they fit 32 bits) so that
  // a copy's source address is one wide multiply-add, or kNoRow. Every K block takes 64 new
  // rows, so a lookup right before its copies puts a dependent global load on the producer's
  // path at every stage (session 21, Nsight Compute: 80 % of the producer's cycles waiting on
  // them, also with a one-block lookahead, since the consumers wait for that same stage). Here each producer thread loads kIdxPerThread rows of
  // the next chunk (coalesced: row t + 128 j) while the copies of the current chunk read theirs
  // from shared memory; at a chunk boundary the loaded rows go into the chunk's buffer (two,
  // alternating) behind a producer-only barrier. The last chunk of a tile loads the first chunk
  // of the producer's next tile, so the latency is hidden there too.
  struct RowStager {
    const int32_t* idx;
    int64_t rows;
    uint32_t ld16;  // the operand's row length in 16-byte units (ld / 8)
    uint32_t* buf;  // [2][kIdxChunk] in shared memory
    uint32_t pend[kIdxPerThread];

    // Issues the loads of rows [chunk · kIdxChunk, ...) of the tile with group rows [begin, end).
    __device__ __forceinline__ void fetch(int begin, int end, int chunk, int tid) {
      const int row0 = begin + chunk * kIdxChunk + tid;
#pragma unroll
      for (int j = 0; j < kIdxPerThread; ++j) {
        const int64_t r = src_row(idx, rows, row0 + j * kProducerThreads, end);
        pend[j] = r < 0 ? kNoRow : uint32_t(r) * ld16;
      }
    }

    // Writes the fetched rows into chunk `chunk`'s buffer (the caller syncs before reading).
    __device__ __forceinline__ void publish(int chunk, int tid) {
      uint32_t* dst = buf + (chunk & 1) * kIdxChunk + tid;
#pragma unroll
      for (int j = 0; j < kIdxPerThread; ++j) dst[j * kProducerThreads] = pend[j];
    }

    // The source rows of K block kt (of the current tile): kBK entries.
    __device__ __forceinline__ const uint32_t* block(int kt) const {
      return buf + ((kt / kBlocksPerChunk) & 1) * kIdxChunk + (kt % kBlocksPerChunk) * kBK;
    }
  };

  // Issues the loads of chunk `chunk` of the tile tc for each gathered operand.
  static __device__ __forceinline__ void fetch_rows(RowStager& sa, RowStager& sb,
                                                    const TileCoord& tc, int chunk, int tid) {
    if constexpr (!kTmaA) sa.fetch(tc.row_begin, tc.row_end, chunk, tid);
    if constexpr (!kTmaB) sb.fetch(tc.row_begin, tc.row_end, chunk, tid);
  }

  static __device__ __forceinline__ void producer_sync() {
    cutlass::arch::NamedBarrier::sync(kProducerThreads, 1);  // consumers use id 0
  }

  // Where element (col, k) of an MN-major stage of kWidth columns lives (elements from the
  // stage's start), for CUTLASS's 128-byte-swizzle atoms of 64 columns x 8 rows (the 16-byte
  // chunk index XOR the row mod 8): the TMA collective (configs 6, 8) tiles them along K first,
  // so each 64-column block is BK rows of 128 bytes (where TMA's boxes put them); the cp.async
  // one (config 5) along the columns first. layout_ok checks this against both operands.
  template <int kWidth>
  static __host__ __device__ constexpr int chunk_offset(int col, int k) {
    constexpr int kBlock = kTma ? 64 * kBK : 512, kGroup = kTma ? 512 : 8 * kWidth;
    return (col / 64) * kBlock + (k / 8) * kGroup + 64 * (k % 8) + 8 * (((col % 64) / 8) ^ (k % 8));
  }

  // Byte offsets from a stage's start of the rows k_first + s (s = i · kStep) of column `col`,
  // the chunks one producer thread copies. k_first < kStep <= 8, so row k_first + s has k mod 8
  // = k_first ^ (s mod 8) and k / 8 = s / 8: chunk_offset of (col, k_first) or of
  // (col, k_first ^ 4) plus a constant, computed once per thread. layout_ok compares every
  // thread's offsets with the stage layouts.
  template <int kWidth, int kStep>
  struct RowDst {
    static_assert(kStep == 4 || kStep == 8, "a thread's rows must keep k mod 8 or flip its bit 2");
    static constexpr int kGroup = chunk_offset<kWidth>(0, 8) - chunk_offset<kWidth>(0, 0);
    uint32_t even, odd;
    __host__ __device__ RowDst(int col, int k_first)
        : even(2u * uint32_t(chunk_offset<kWidth>(col, k_first))),
          odd(2u * uint32_t(chunk_offset<kWidth>(col, k_first ^ 4))) {}
    __host__ __device__ uint32_t operator()(int s) const {
      return (s % 8 == 0 ? even : odd) + 2u * uint32_t(kGroup * (s / 8));
    }
  };

  // This thread's kIters staged row offsets of a K block (src: the block's, k_first its first
  // row), read before the copies: each copy is an asm statement with a memory clobber, so a
  // read between two of them could not move up, and every copy waited for its own
  // shared-memory load (Nsight Compute, session 22: the producer's most-sampled stalls).
  template <int kIters, int kStep>
  struct RowOffsets {
    uint32_t o[kIters];
    __device__ __forceinline__ void load(const uint32_t* src, int k_first) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) o[i] = src[k_first + i * kStep];
    }
  };

  // One operand's rows of a stage by cp.async: this thread's 16-byte chunk (column `col` of the
  // block) of rows k_first + i · kStep, from base + 8 · rows.o[i] elements (kNoRow, or
  // !col_ok, zero-fills the chunk) to the stage at shared address `stage_addr` (RowDst: one of
  // two bases plus an immediate). Before session 22 each copy took ~30 instructions of
  // generic-pointer and 64-bit index arithmetic, which kept the producer from feeding the
  // wgmmas (Nsight Compute: 2.3 G instructions against CUTLASS's 0.64 G for the same dW1).
  template <int kWidth, int kIters, int kStep>
  static __device__ __forceinline__ void copy_rows(uint32_t stage_addr, int col, int k_first,
                                                   bool col_ok,
                                                   const RowOffsets<kIters, kStep>& rows,
                                                   const Bf16* base) {
    const RowDst<kWidth, kStep> dst(col, k_first);
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const bool ok = col_ok && rows.o[i] != kNoRow;
      const Bf16* g = base + uint64_t(ok ? rows.o[i] : 0u) * kChunk;
      cp_async_16_u32(stage_addr + dst(i * kStep), g, ok);
    }
  }

  // Producer warpgroup: one stage per K block of the group's rows; A (rows x M block) and B
  // (rows x N block), each row as 16-byte chunks along M / N. The gathered operands' source rows
  // come from their RowStager, whose `pend` holds this tile's first chunk on entry and, on
  // return, the first chunk of `next` (the producer's next tile, if has_next).
  static __device__ void load_tile(const Params& p, const TileCoord& tc, bool has_next,
                                   const TileCoord& next, int k_tiles, Pipeline& pipe,
                                   PipeState& state, Publisher& pub, RowStager& sa, RowStager& sb,
                                   typename Mainloop::TensorStorage& smem, int tid, int rank) {
    using namespace cute;
    const uint32_t sa_addr = cute::cast_smem_ptr_to_uint(smem.smem_A.data());
    const uint32_t sb_addr = cute::cast_smem_ptr_to_uint(smem.smem_B.data());
    const int a_col = (tid % kAChunks) * kChunk, a_k = tid / kAChunks;
    const int b_col = (tid % kBChunks) * kChunk, b_k = tid / kBChunks;
    const bool a_col_ok = tc.m0 + a_col < p.m, b_col_ok = tc.n0 + b_col < p.n;
    const Bf16* a_base = p.a + tc.m0 + a_col;
    const Bf16* b_base = p.b + tc.n0 + b_col;
    const int chunks = (k_tiles + kBlocksPerChunk - 1) / kBlocksPerChunk;
    // Loads of the chunk after `c` (this tile's or the next tile's first).
    auto fetch_after = [&](int c) {
      if (c + 1 < chunks) {
        fetch_rows(sa, sb, tc, c + 1, tid);
      } else if (has_next) {
        fetch_rows(sa, sb, next, 0, tid);
      }
    };
    // Chunk c's rows into their buffer. The barrier before: no thread still reads that buffer
    // (the previous tile may have used it); after: every thread sees the rows.
    auto publish = [&](int c, bool sync_before) {
      if (sync_before) producer_sync();
      if constexpr (!kTmaA) sa.publish(c, tid);
      if constexpr (!kTmaB) sb.publish(c, tid);
      producer_sync();
    };
    publish(0, true);
    fetch_after(0);
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int row0 = tc.row_begin + kt * kBK;
      if (kt > 0 && kt % kBlocksPerChunk == 0) {
        // Buffer c & 1 was last read in chunk c - 2, before every thread passed the barrier
        // that published chunk c - 1.
        const int c = kt / kBlocksPerChunk;
        publish(c, false);
        fetch_after(c);
      }
      // The block's row offsets first: their loads overlap the wait for a free stage.
      RowOffsets<kAIters, kAStep> a_rows;
      RowOffsets<kBIters, kBStep> b_rows;
      if constexpr (!kTmaA) a_rows.load(sa.block(kt), a_k);
      if constexpr (!kTmaB) b_rows.load(sb.block(kt), b_k);
      pipe.producer_acquire(state);
      const int stage = state.index();
      if constexpr (kTmaA) {
        if (tid == 0) load_tma(&p.tma, row0, tc.m0, smem.smem_A.data() + stage * (kBM * kBK),
                               pipe.producer_get_barrier(state), rank);
      } else {
        copy_rows<kBM>(sa_addr + uint32_t(stage * kBM * kBK * 2), a_col, a_k, a_col_ok, a_rows,
                       a_base);
      }
      if constexpr (kTmaB) {
        if (tid == 0) load_tma(&p.tma, row0, tc.n0, smem.smem_B.data() + stage * (kBN * kBK),
                               pipe.producer_get_barrier(state), rank);
      } else {
        copy_rows<kBN>(sb_addr + uint32_t(stage * kBN * kBK * 2), b_col, b_k, b_col_ok, b_rows,
                       b_base);
      }
      if constexpr (kTma) {
        // Arrives once this thread's cp.async copies landed; the full barrier also waits for
        // the leader's arrive_and_expect_tx (producer_acquire) and the TMA bytes.
        cutlass::arch::cpasync_barrier_arrive_noinc(pipe.producer_get_barrier(state));
      } else {
        pub.filled(pipe);
      }
      ++state;
    }
  }

  // kTmaAB, leader thread: one stage per K block of the group's rows, A's (BK, BM) and B's
  // (BK, BN) tiles by TMA (rows past the group end belong to the next group or read zeros past
  // the tensor: the consumers zero them, see consume).
  static __device__ void load_tile_tma(const Params& p, const TileCoord& tc, int k_tiles,
                                       Pipeline& pipe, PipeState& state,
                                       typename Mainloop::TensorStorage& smem) {
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int row0 = tc.row_begin + kt * kBK;
      pipe.producer_acquire(state);
      const int stage = state.index();
      uint64_t* full = pipe.producer_get_barrier(state);
      load_tma<kBM>(&p.tma, row0, tc.m0, smem.smem_A.data() + stage * (kBM * kBK), full, 0);
      load_tma<kBN>(&p.tma_b, row0, tc.n0, smem.smem_B.data() + stage * (kBN * kBK), full, 0);
      ++state;
    }
  }

  // kTma, leader thread: this CTA's half of the stage's tile of the TMA operand, rows
  // [row0, row0 + BK) (columns col0 + rank · width/2 on), as boxes of 64 columns x BK rows
  // multicast to both CTAs of the cluster (each CTA's full barrier expects the whole tile; the
  // stage holds each 64-column block as BK rows of 128 bytes). Rows past the end read zeros.
  // With kCluster == 1 the leader loads the whole tile into its own stage.
  // tma: the operand's descriptor; kWidth: its tile width (BM for A, BN for B).
  template <int kWidth = kTmaWidth>
  static __device__ void load_tma(const cute::TmaDescriptor* tma, int row0, int col0,
                                  Bf16* stage, uint64_t* full_barrier, int rank) {
    constexpr uint16_t kBothCtas = 0b11;
    constexpr int kHalf = kWidth / 2;
    const uint64_t hint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    if constexpr (kCluster == 1) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kWidth / 64; ++i) {
        cute::SM90_TMA_LOAD_2D::copy(tma, full_barrier, hint, stage + i * 64 * kBK,
                                     col0 + i * 64, row0);
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kHalf / 64; ++i) {
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(tma, full_barrier, kBothCtas, hint,
                                               stage + (rank * kHalf + i * 64) * kBK,
                                               col0 + rank * kHalf + i * 64, row0);
      }
    }
  }

  // kTma consumers (CUTLASS's `mma` has no place for the proxy fences): wait for stage s, fence
  // the producers' cp.async writes against the wgmma reads, zero the TMA operand's rows past the
  // group end in the group's last block (`last_rows` < BK; see the top of this file), issue the
  // stage's wgmmas, then release stage s - 1 once its wgmmas completed. Advances `rd`.
  template <class Accum>
  static __device__ void consume(Pipeline& pipe, PipeState& rd, Accum& acc, int k_tiles,
                                 int last_rows, int mma_tid,
                                 typename Mainloop::TensorStorage& smem) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});
    TiledMma mma;
    const int wg = __shfl_sync(0xffffffffu, mma_tid / cutlass::NumThreadsPerWarpGroup, 0);
    auto thr = mma.get_slice(wg * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    PipeState release = rd;
    warpgroup_fence_operand(acc);
    for (int kt = 0; kt < k_tiles; ++kt) {
      pipe.consumer_wait(rd);
      const int s = rd.index();
      if (kt == k_tiles - 1 && last_rows < kBK) {
        // 16-byte stores of 8 columns each (contiguous and aligned: stage_layouts_ok); 2-byte
        // stores took ~20 address instructions per element. kTmaAB: A's columns, then B's.
        constexpr int kRowChunks = kTmaWidth / kChunk;
        for (int i = mma_tid; i < kRowChunks * (kBK - last_rows); i += kMmaThreads) {
          const int c = (i % kRowChunks) * kChunk, k = last_rows + i / kRowChunks;
          Bf16* dst = kTmaAB ? (c < kBM ? &sA(c, k, s) : &sB(c - kBM, k, s))
                             : kTmaA ? &sA(c, k, s) : &sB(c, k, s);
          *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
        cutlass::arch::fence_view_async_shared();  // generic zeros -> wgmma reads
        cutlass::arch::NamedBarrier::sync(kMmaThreads, 0);  // the warpgroups share the tile
      }
      // cp.async writes (generic proxy) -> wgmma reads; kTmaAB has none.
      if constexpr (!kTmaAB) cutlass::arch::fence_view_async_shared();
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
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    pipe.consumer_release(release);
  }

  // Host check of both operands' stage layouts (which the wgmma descriptors follow) against
  // chunk_offset, where copy_rows and the TMA boxes of load_tma put each (column, k, stage)
  // element: stages one after another, each 64-column block as BK rows of 128 bytes, 128-byte
  // swizzle (TMA's: the 16-byte chunk index XOR the row mod 8). It also makes every 16-byte
  // chunk (8 consecutive columns from a multiple of 8) contiguous and aligned.
  static bool stage_layouts_ok() {
    return stage_layout_is<SmemLayoutA>(kBM, kBK, Pipeline::Stages, [](int c, int k) {
             return chunk_offset<kBM>(c, k) + c % 8;
           }) && stage_layout_is<SmemLayoutB>(kBN, kBK, Pipeline::Stages, [](int c, int k) {
             return chunk_offset<kBN>(c, k) + c % 8;
           });
  }

  // ... and `store` writes column pairs: each thread's accumulators (i, i + 1), i even, must be
  // (r, c) and (r, c + 1) with c even.
  static bool pairs_ok() {
    using namespace cute;
    for (int t = 0; t < kMmaThreads; ++t) {
      Tensor coord = TiledMma{}.get_slice(t).partition_C(
          make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{})));
      for (int i = 0; i + 1 < int(size(coord)); i += 2) {
        const int r = get<0>(coord(i)), c = get<1>(coord(i));
        if (c % 2 != 0 || get<0>(coord(i + 1)) != r || get<1>(coord(i + 1)) != c + 1) return false;
      }
    }
    return true;
  }

  // Host check of RowDst: every producer thread's rows of every stage land where the operand's
  // stage layout puts them.
  template <int kWidth, int kIters, int kStep, class Layout>
  static bool row_dst_ok() {
    using namespace cute;
    const size_t elems = size_t(cosize(Layout{}));
    void* buf = std::aligned_alloc(1024, (elems * sizeof(Bf16) + 1023) / 1024 * 1024);
    if (buf == nullptr) return false;
    Bf16* base = static_cast<Bf16*>(buf);
    Tensor s = make_tensor(make_smem_ptr(base), Layout{});
    bool ok = true;
    for (int tid = 0; ok && tid < kProducerThreads; ++tid) {
      const int col = (tid % (kWidth / kChunk)) * kChunk, k_first = tid / (kWidth / kChunk);
      const RowDst<kWidth, kStep> dst(col, k_first);
      for (int st = 0; ok && st < Pipeline::Stages; ++st) {
        for (int i = 0; ok && i < kIters; ++i) {
          ok = int64_t(st) * kWidth * kBK * 2 + dst(i * kStep) ==
               2 * (&s(col, k_first + i * kStep, st) - base);
        }
      }
    }
    std::free(buf);
    return ok;
  }

  static bool layout_ok() {
    return stage_layouts_ok() && pairs_ok() && quad_groups_ok<TiledMma, kBM, kBN>() &&
           row_dst_ok<kBM, kAIters, kAStep, SmemLayoutA>() &&
           row_dst_ok<kBN, kBIters, kBStep, SmemLayoutB>();
  }

  // D_e's (BM, BN) tile at d (leading dimension ld) from the accumulators; rows >= rows and
  // columns >= cols are not written (cols and ld multiples of 8). store_acc_tile
  // (gather_gemm.cuh): bf16 as 16-byte stores of 8 columns per lane. Until session 36 this
  // kernel stored 4-byte pairs, each warp store filling half of every sector it touched, the
  // pattern that held config 14's down_proj at half CUTLASS's speed until session 31.
  template <class Accum>
  static __device__ void store(Out* d, int64_t ld, int rows, int cols, const Accum& acc,
                               int mma_tid) {
    using namespace cute;
    store_acc_tile(d, ld, rows, cols,
                   TiledMma{}.get_slice(mma_tid).partition_C(
                       make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{}))),
                   acc, mma_tid);
  }

  static __device__ Pipeline make_pipeline(SharedStorage& smem, int wg) {
    typename Pipeline::Params pp;
    pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    if constexpr (kTmaAB) {
      pp.is_leader = threadIdx.x == 0;
      pp.num_consumers = kMmaThreads;
      pp.num_producers = 1;                     // the leader's expect_tx only
      pp.transaction_bytes = kTmaBytes;         // A's and B's tiles
      return Pipeline(smem.pipeline, pp, cute::Shape<cute::_1, cute::_1, cute::_1>{});
    } else if constexpr (kTma) {
      pp.is_leader = threadIdx.x == 0;
      pp.num_consumers = kMmaThreads;
      pp.num_producers = kProducerThreads + 1;  // noinc arrivals + the leader's expect_tx
      pp.transaction_bytes = kTmaBytes;         // both halves of the tile land in each CTA
      return Pipeline(smem.pipeline, pp, cute::Shape<cute::Int<kCluster>, cute::_1, cute::_1>{});
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
    int rank = 0;
    if constexpr (kCluster == 2) {
      rank = static_cast<int>(cute::block_rank_in_cluster());
      cute::cluster_sync();  // both CTAs' barriers initialised before any multicast reaches them
    } else {
      __syncthreads();  // barrier initialisation visible to every warpgroup
    }
    // Both CTAs of a cluster walk the same tiles (they differ in M or N block only).
    const int total = p.num_groups * p.m_units * p.n_units;
    const int first = blockIdx.x / kCluster, step = gridDim.x / kCluster;
    if (wg == 0) {
      if constexpr (kTmaAB) {
        // One thread issues every copy; the rest of the warpgroup has nothing to do.
        if (threadIdx.x == 0) {
          PipeState state = cutlass::make_producer_start_state<Pipeline>();
          cute::prefetch_tma_descriptor(&p.tma);
          cute::prefetch_tma_descriptor(&p.tma_b);
          for (int tile = first; tile < total; tile += step) {
            const TileCoord tc = locate(p, tile, rank);
            load_tile_tma(p, tc, k_tiles_of(tc), pipe, state, smem.tensors);
          }
          pipe.producer_tail(state);
        }
      } else {
        PipeState state = cutlass::make_producer_start_state<Pipeline>();
        Publisher pub{state};
        const int tid = threadIdx.x;
        if constexpr (kTma) {
          if (tid == 0) cute::prefetch_tma_descriptor(&p.tma);
        }
        RowStager sa{p.a_idx, p.a_rows, uint32_t(p.m / kChunk), &smem.rows[0][0][0]};
        RowStager sb{p.b_idx, p.b_rows, uint32_t(p.n / kChunk), &smem.rows[1][0][0]};
        // Each tile is located once: the lookahead of one iteration is the tile of the next.
        TileCoord tc{};
        if (first < total) {
          tc = locate(p, first, rank);
          fetch_rows(sa, sb, tc, 0, tid);
        }
        for (int tile = first; tile < total; tile += step) {
          const bool more = tile + step < total;
          TileCoord next{};
          if (more) next = locate(p, tile + step, rank);
          load_tile(p, tc, more, next, k_tiles_of(tc), pipe, state, pub, sa, sb, smem.tensors, tid,
                    rank);
          tc = next;
        }
        if constexpr (!kTma) pub.flush(pipe);
        // The consumers (of both CTAs, with kTma) release every stage before the CTA exits.
        pipe.producer_tail(state);
      }
    } else {
      PipeState state;
      const int mma_tid = threadIdx.x - kProducerThreads;
      for (int tile = first; tile < total; tile += step) {
        const TileCoord rows = locate(p, tile, rank);
        const int k_tiles = k_tiles_of(rows);
        auto acc = partition_fragment_C(TiledMma{}, take<0, 2>(Tile{}));
        if (k_tiles == 0) {
          clear(acc);  // an empty expert's gradient is zero
        } else if constexpr (kTma) {
          const int last_rows = rows.row_end - rows.row_begin - (k_tiles - 1) * kBK;
          consume(pipe, state, acc, k_tiles, last_rows, mma_tid, smem.tensors);
        } else {
          Mainloop mainloop;
          const typename Mainloop::Params unused{};  // the consumer half reads no parameter
          mainloop.mma(pipe, state, acc, k_tiles, mma_tid, smem.tensors, unused);
          mainloop.mma_tail(pipe, state, k_tiles);
          state.advance(k_tiles);
        }
        // Only the epilogue needs the tile's coordinates: locate it again after the mainloop.
        const TileCoord tc = locate(p, tile, rank);
        if (tc.m0 < p.m && tc.n0 < p.n) {
          Out* d = p.d + (int64_t(tc.e) * p.m + tc.m0) * p.n + tc.n0;
          store(d, p.n, p.m - tc.m0, p.n - tc.n0, acc, mma_tid);
        }
      }
    }
  }
};

template <class G>
__global__ void __launch_bounds__(G::kThreads, 1)
    gather_wgrad_kernel(const __grid_constant__ typename G::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem_buf[];
  G::run(p, smem_buf);
#endif
}

template <class G>
struct WgradLauncher {
  using Gemm = G;
  static size_t workspace_bytes(int) { return kWsAlign; }  // unused; keeps the FFI contract

  static std::string run(const GroupedGemmParams& p, const int32_t* a_idx, const int32_t* b_idx,
                         int64_t a_rows, int64_t b_rows, cudaStream_t stream) {
    if (p.num_groups < 1) return "need at least one group";
    // The cp.async operands' staged row offsets are 32-bit counts of 16-byte chunks
    // (GatherWgrad::RowStager).
    if ((!G::kTmaA && a_rows * (p.m / 8) >= int64_t(G::kNoRow)) ||
        (!G::kTmaB && b_rows * (p.n / 8) >= int64_t(G::kNoRow))) {
      return "an operand of 2^35 elements or more (rows x columns): its row offsets in 16-byte "
             "units must fit 32 bits";
    }
    if ((G::kTmaB && b_idx != nullptr) || (G::kTmaA && a_idx != nullptr)) {
      return "the TMA schedule reads one operand's rows in order: it must not be gathered";
    }
    static const bool layout_checked = G::layout_ok();
    if (!layout_checked) return "shared-memory layout differs from what the producer writes";
    typename G::Params kp{};
    kp.a = static_cast<const Bf16*>(p.a);
    kp.a_idx = a_idx;
    kp.b = static_cast<const Bf16*>(p.b);
    kp.b_idx = b_idx;
    kp.d = static_cast<typename G::OutType*>(p.d);
    kp.group_offsets = p.group_offsets;
    kp.num_groups = p.num_groups;
    kp.m = p.m;
    kp.n = p.n;
    kp.m_tiles = (p.m + G::kBM - 1) / G::kBM;
    kp.n_tiles = (p.n + G::kBN - 1) / G::kBN;
    kp.m_units = G::kTmaB && G::kCluster == 2 ? (kp.m_tiles + 1) / 2 : kp.m_tiles;
    kp.n_units = G::kTmaA && G::kCluster == 2 ? (kp.n_tiles + 1) / 2 : kp.n_tiles;
    kp.a_rows = a_rows;
    kp.b_rows = b_rows;
    const int64_t tiles = int64_t(p.num_groups) * kp.m_units * kp.n_units;
    if (tiles >= (int64_t(1) << 31)) return "too many output tiles";
    auto kernel = gather_wgrad_kernel<G>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           G::kSmemBytes);
    if (err != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err);
    if constexpr (G::kTmaAB) {
      // Both operands, a (a_rows, M) and b (b_rows, N), as below.
      std::string tma_err = encode_tma_2d(p.a, p.m, a_rows, G::kBK, &kp.tma,
                                          "cuTensorMapEncodeTiled for a");
      if (tma_err.empty()) {
        tma_err = encode_tma_2d(p.b, p.n, b_rows, G::kBK, &kp.tma_b,
                                "cuTensorMapEncodeTiled for b");
      }
      if (!tma_err.empty()) return tma_err;
    } else if constexpr (G::kTma) {
      // The TMA operand, a (a_rows, M) or b (b_rows, N), boxes of 64 columns x BK rows; rows
      // 16-byte aligned (M, N % 8 == 0, checked by the handler); rows past the end read zeros.
      std::string tma_err = encode_tma_2d(G::kTmaA ? p.a : p.b, G::kTmaA ? p.m : p.n,
                                          G::kTmaA ? a_rows : b_rows, G::kBK, &kp.tma,
                                          "cuTensorMapEncodeTiled");
      if (!tma_err.empty()) return tma_err;
    }
    if constexpr (G::kCluster == 1) {
      const int grid = static_cast<int>(tiles < sm_count() ? tiles : sm_count());
      kernel<<<grid, G::kThreads, G::kSmemBytes, stream>>>(kp);
    } else {
      std::string launch_err = launch_on_clusters(kernel, kp, G::kCluster, G::kThreads,
                                                  G::kSmemBytes, tiles, stream,
                                                  "gathered varlen-K launch");
      if (!launch_err.empty()) return launch_err;
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return std::string("gathered varlen-K launch: ") + cudaGetErrorString(err);
    return {};
  }
};

}  // namespace gather
}  // namespace sonic
