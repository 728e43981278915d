// How fast can a Hopper CTA fill the 128-byte-swizzled stages of a weight-gradient GEMM with
// gathered rows? A standalone probe for lever 3 of docs/ffi.md ("Where 120B-n512's step goes"):
// the gathered varlen-K kernel (csrc/gather_wgrad.cuh) fills its gathered operand with 16-byte
// cp.async chunks and runs 1.2-1.3x slower than CUTLASS's varlen-K GEMM over a gathered copy,
// whose operands come by TMA; Nsight Compute put the consumers' waits on full stages. The same
// kernel with both operands by TMA and no gather (config 14) was as slow, so the producer is not
// the whole gap (session 36 changed the epilogue's stores, another part they share); this probe
// says whether, once the rest is closed, the gathered operand could come by TMA as well. Here the
// same stage (kBK = 64 gathered rows x kBM = 256 or 128 columns, bf16, 32 or 16 KiB, the
// MN-major 128-byte swizzle of gather_wgrad.cuh's TMA collectives) is filled three ways, with no
// MMA, so only the loads count:
//   cp.async  : 128 producer threads, one 16-byte cp.async per chunk, noinc arrivals (the
//               kernel's scheme today);
//   tma-rows  : one producer warp, one TMA box of 64 columns x 1 row per gathered row and
//               64-column block (kBM / 64 per row), straight into the swizzled stage;
//   tma-tile  : one TMA box of 64 columns x 64 rows per block, rows in order (what CUTLASS
//               does over a gathered copy): the ceiling.
// tma-rows rests on an assumption this program checks first: that the hardware's 128-byte
// swizzle of a one-row box follows the destination's shared-memory address bits (row k of a
// 1024-byte-aligned block lands with its chunks XOR k mod 8), so one-row boxes build the same
// stage as one 64-row box. Every mode's stages are compared with x[idx] chunk by chunk before
// anything is timed.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o tma_row_gather benchmarks/cuda/tma_row_gather.cu
//   ./tma_row_gather [rows=32768] [cols=4096] [window_rows=2048] [stages_per_cta=4000]
//
// window_rows: gathered rows are drawn from the first window_rows rows of x (2048 rows x 8 KiB
// = 16 MiB: one expert's rows at 120B-n512, L2-resident as in the GEMM, whose CTAs share an
// expert); rows: all of x (256 MiB, from HBM). Prints GB/s over all CTAs and the time per stage
// per CTA, against the 0.85 us a 256 x 128 x 64 tile of wgmmas takes at 650 TFLOP/s over 132
// SMs.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kBK = 64;  // gathered rows per stage (the GEMM's K block)
constexpr int kStages = 4;
constexpr int kProducerThreads = 128, kConsumerThreads = 128;
constexpr int kThreads = kProducerThreads + kConsumerThreads;

// A stage of kBM columns (the gathered operand's M side: 256 for configs 8 / 9's 256 x 128
// tiles, 128 for configs 5 / 6's 128 x 256).
template <int kBM_>
struct Stage {
  static constexpr int kBM = kBM_;
  static constexpr int kBlocks = kBM / 64;             // 64-column blocks of 128-byte rows
  static constexpr int kBytes = kBK * kBM * 2;         // 32 or 16 KiB
  static constexpr int kChunksPerRow = kBM / 8;        // 16-byte chunks
  static constexpr int kChunks = kBK * kChunksPerRow;  // per stage
  static constexpr int kSmemBytes = kStages * kBytes + 2 * kStages * 8 + 1024;
};

enum Mode : int { kCpAsync = 0, kTmaRows = 1, kTmaTile = 2 };
const char* const kModeNames[] = {"cp.async", "tma-rows", "tma-tile"};

// Byte offset in a stage of element (k, col): 64-column blocks of kBK rows x 128 bytes, each
// 16-byte chunk XOR the row mod 8 (gather_wgrad.cuh's chunk_offset for its TMA collectives).
__host__ __device__ constexpr uint32_t stage_offset(int k, int col) {
  return uint32_t((col / 64) * (kBK * 128) + k * 128 + ((((col % 64) / 8) ^ (k % 8)) * 16) +
                  (col % 8) * 2);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// Arrives on `bar` once this thread's earlier cp.async copies have landed (no pending-count
// increment: the barrier's count includes these arrivals).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// Stage s of CTA b: rows idx[(b * stages + s) * kBK + k] (gathered modes) or rows
// (b * stages + s) * kBK + k modulo the window (tma-tile), columns [m0, m0 + kBM).
__device__ __forceinline__ int64_t stage_id(int s, int stages) {
  return int64_t(blockIdx.x) * stages + s;
}
__device__ __forceinline__ int stage_m0(int64_t id, int cols, int bm) {
  return int((id % (cols / bm)) * bm);
}

template <int kMode, int kBM>
__global__ void __launch_bounds__(kThreads, 1)
    fill_stages(const __grid_constant__ CUtensorMap row_map,
                const __grid_constant__ CUtensorMap tile_map, const uint16_t* __restrict__ x,
                const int32_t* __restrict__ idx, int cols, int window, int stages, int verify,
                unsigned long long* mismatches, unsigned long long* checksum) {
  using S = Stage<kBM>;
  constexpr int kStageBytes = S::kBytes, kChunksPerRow = S::kChunksPerRow;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], kMode == kCpAsync ? kProducerThreads : 1);
      mbar_init(&empty[i], kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (tid < kProducerThreads) {
    if constexpr (kMode == kCpAsync) {
      // Thread t copies chunk t % 32 of rows t / 32 + 4 i: a warp covers one 512-byte row
      // slice. The next stage's row indices are loaded before waiting for its slot.
      constexpr int kRowStep = kProducerThreads / kChunksPerRow, kIters = kBK / kRowStep;
      const int col = (tid % kChunksPerRow) * 8, k0 = tid / kChunksPerRow;
      int32_t rows[kIters];
      auto load_rows = [&](int s) {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          rows[i] = __ldg(idx + stage_id(s, stages) * kBK + k0 + kRowStep * i);
        }
      };
      load_rows(0);
      for (int s = 0; s < stages; ++s) {
        const int slot = s % kStages;
        mbar_wait(&empty[slot], ((s / kStages) & 1) ^ 1);
        const uint32_t base = smem_addr(smem + slot * kStageBytes);
        const uint16_t* src = x + stage_m0(stage_id(s, stages), cols, kBM) + col;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          cp_async_16(base + stage_offset(k0 + kRowStep * i, col), src + int64_t(rows[i]) * cols);
        }
        cp_async_arrive_noinc(&full[slot]);
        if (s + 1 < stages) load_rows(s + 1);
      }
      asm volatile("cp.async.wait_all;" ::: "memory");
    } else if (tid < 32) {
      // One warp: lane l brings rows l and l + 32 (tma-rows), lane 0 the four tiles (tma-tile).
      const int lane = tid;
      int32_t rows[2];
      auto load_rows = [&](int s) {
        if constexpr (kMode == kTmaRows) {
          rows[0] = __ldg(idx + stage_id(s, stages) * kBK + lane);
          rows[1] = __ldg(idx + stage_id(s, stages) * kBK + lane + 32);
        }
      };
      load_rows(0);
      for (int s = 0; s < stages; ++s) {
        const int slot = s % kStages;
        mbar_wait(&empty[slot], ((s / kStages) & 1) ^ 1);
        const int64_t id = stage_id(s, stages);
        const int m0 = stage_m0(id, cols, kBM);
        uint8_t* stage = smem + slot * kStageBytes;
        if (lane == 0) mbar_arrive_expect_tx(&full[slot], kStageBytes);
        __syncwarp();
        if constexpr (kMode == kTmaRows) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int k = lane + 32 * r;
#pragma unroll
            for (int b = 0; b < S::kBlocks; ++b) {
              tma_load_2d(stage + b * (kBK * 128) + k * 128, &row_map, m0 + 64 * b, rows[r],
                          &full[slot]);
            }
          }
        } else if (lane == 0) {
          const int row0 = int((id * kBK) % window);
#pragma unroll
          for (int b = 0; b < S::kBlocks; ++b) {
            tma_load_2d(stage + b * (kBK * 128), &tile_map, m0 + 64 * b, row0, &full[slot]);
          }
        }
        if (s + 1 < stages) load_rows(s + 1);
      }
    }
  } else {
    // Consumers: wait for each stage; with `verify` compare every chunk with x, otherwise read
    // one chunk each (so the stage is used) and release it.
    const int ct = tid - kProducerThreads;
    unsigned long long bad = 0, sum = 0;
    for (int s = 0; s < stages; ++s) {
      const int slot = s % kStages;
      mbar_wait(&full[slot], (s / kStages) & 1);
      const uint8_t* stage = smem + slot * kStageBytes;
      if (verify) {
        const int64_t id = stage_id(s, stages);
        const int m0 = stage_m0(id, cols, kBM);
        for (int q = ct; q < S::kChunks; q += kConsumerThreads) {
          const int k = q / kChunksPerRow, col = (q % kChunksPerRow) * 8;
          const int64_t row = kMode == kTmaTile ? (id * kBK + k) % window : idx[id * kBK + k];
          const uint4 got = *reinterpret_cast<const uint4*>(stage + stage_offset(k, col));
          const uint4 want = *reinterpret_cast<const uint4*>(x + row * cols + m0 + col);
          bad += (got.x != want.x) + (got.y != want.y) + (got.z != want.z) + (got.w != want.w);
        }
      } else {
        const uint4 v = *reinterpret_cast<const uint4*>(stage + ct * 16);
        sum += v.x ^ v.w;
      }
      mbar_arrive(&empty[slot]);
    }
    if (bad) atomicAdd(mismatches, bad);
    atomicAdd(checksum, sum);
  }
}

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(e_));                                                \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                              cudaEnableDefault, &status));
  if (fn == nullptr || status != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// x (rows, cols) uint16 as a 2-D tensor map with boxes of 64 columns x box_rows rows, 128-byte
// swizzle (the inner box is 128 bytes, as the swizzle requires).
CUtensorMap make_map(const uint16_t* x, int rows, int cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<uint16_t*>(x),
                           dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return map;
}

template <int kMode, int kBM>
float run(const CUtensorMap& row_map, const CUtensorMap& tile_map, const uint16_t* x,
          const int32_t* idx, int cols, int window, int ctas, int stages, int verify,
          unsigned long long* counters) {
  auto kernel = fill_stages<kMode, kBM>;
  constexpr int kSmemBytes = Stage<kBM>::kSmemBytes;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  kernel<<<ctas, kThreads, kSmemBytes>>>(row_map, tile_map, x, idx, cols, window, stages, verify,
                                         counters, counters + 1);
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  CHECK_CUDA(cudaGetLastError());
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

}  // namespace

// Every mode at stage width kBM: prints one row per mode; returns the number of modes whose
// stages differed from x[idx].
template <int kBM>
int measure_width(const CUtensorMap& row_map, const CUtensorMap& tile_map, const uint16_t* x,
                  const int32_t* idx, int cols, int window, int ctas, int stages,
                  unsigned long long* counters) {
  constexpr int kStageBytes = Stage<kBM>::kBytes;
  std::printf("-- %d rows x %d columns per stage (%d KiB)\n", kBK, kBM, kStageBytes / 1024);
  std::printf("%-9s %10s %12s %14s\n", "mode", "mismatch", "GB/s", "us/stage/CTA");
  int failures = 0;
  // tma-rows last: if the hardware refuses one-row boxes at 128-byte (not 1024-byte) aligned
  // swizzled destinations, the launch fails and ends the process after the other two rows.
  for (int mode : {int(kCpAsync), int(kTmaTile), int(kTmaRows)}) {
    auto launch = [&](int n_stages, int verify) {
      CHECK_CUDA(cudaMemset(counters, 0, 16));
      switch (mode) {
        case kCpAsync:
          return run<kCpAsync, kBM>(row_map, tile_map, x, idx, cols, window, ctas, n_stages,
                                    verify, counters);
        case kTmaRows:
          return run<kTmaRows, kBM>(row_map, tile_map, x, idx, cols, window, ctas, n_stages,
                                    verify, counters);
        default:
          return run<kTmaTile, kBM>(row_map, tile_map, x, idx, cols, window, ctas, n_stages,
                                    verify, counters);
      }
    };
    launch(std::min(stages, 64), 1);
    unsigned long long host[2];
    CHECK_CUDA(cudaMemcpy(host, counters, 16, cudaMemcpyDeviceToHost));
    const unsigned long long mismatched = host[0];
    failures += mismatched != 0;
    launch(stages, 0);  // warm-up
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) ms.push_back(launch(stages, 0));
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2] * 1e-3;
    const double bytes = double(ctas) * stages * kStageBytes;
    std::printf("%-9s %10llu %12.0f %14.3f\n", kModeNames[mode], mismatched, bytes / t / 1e9,
                t / stages * 1e6);
    std::fflush(stdout);
  }
  return failures;
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 32768;
  const int cols = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int window = std::min(argc > 3 ? std::atoi(argv[3]) : 2048, rows);
  const int stages = argc > 4 ? std::atoi(argv[4]) : 4000;
  if (cols % 256 != 0 || window < kBK || window % kBK != 0 || stages < 1) {
    std::fprintf(stderr, "need cols %% 256 == 0, window_rows a multiple of %d, stages >= 1\n",
                 kBK);
    return 2;
  }
  int dev = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  const int ctas = sms;

  // x: a distinct 16-bit pattern per element; idx: random rows of the window.
  std::vector<uint16_t> hx(size_t(rows) * cols);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = uint16_t((i * 2654435761u) >> 7);
  const int64_t n_idx = int64_t(ctas) * stages * kBK;
  std::vector<int32_t> hidx(n_idx);
  std::mt19937 rng(0);
  std::uniform_int_distribution<int32_t> pick(0, window - 1);
  for (auto& v : hidx) v = pick(rng);

  uint16_t* x = nullptr;
  int32_t* idx = nullptr;
  unsigned long long* counters = nullptr;
  CHECK_CUDA(cudaMalloc(&x, hx.size() * 2));
  CHECK_CUDA(cudaMalloc(&idx, hidx.size() * 4));
  CHECK_CUDA(cudaMalloc(&counters, 16));
  CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(idx, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));
  const CUtensorMap row_map = make_map(x, rows, cols, 1);
  const CUtensorMap tile_map = make_map(x, window, cols, kBK);

  std::printf("%s, %d SMs; x (%d, %d) bf16, gathered rows from the first %d (%.1f MiB); "
              "%d CTAs x %d stages\n",
              prop.name, sms, rows, cols, window, window * double(cols) * 2 / (1 << 20), ctas,
              stages);
  int failures =
      measure_width<256>(row_map, tile_map, x, idx, cols, window, ctas, stages, counters);
  failures += measure_width<128>(row_map, tile_map, x, idx, cols, window, ctas, stages, counters);
  std::printf("(a 256 x 128 x 64 or 128 x 256 x 64 tile of wgmmas: 0.85 us at 650 TFLOP/s over "
              "132 SMs)\n");
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(idx));
  CHECK_CUDA(cudaFree(counters));
  if (failures) std::printf("MISMATCH: a mode's stages differ from x[idx]\n");
  return failures ? 1 : 0;
}
