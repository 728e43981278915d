// CUTLASS 3.x ptr-array grouped GEMM (Hopper TMA + WGMMA, warp-specialized) with the per-group
// problem shapes, pointers and strides built on the device from group_offsets: no host sync.
#pragma once

#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "sonic_ffi.h"

namespace sonic {

// Tile configurations, indexed by sonic::GemmConfig (sonic_ffi.h); the Python side picks one per
// shape from a table measured on the H200 (sonic_jax/ffi/schedules.py).
// Ping-pong: two consumer warpgroups on alternate tiles, so one's epilogue hides under the
// other's mainloop (good for fp32 outputs). Cooperative: both warpgroups split one larger tile.
// A cluster of 2 along M multicasts the B (weight) tile; 2 along N multicasts the A tile.
template <int kM, int kN, int kClusterM, int kClusterN, bool kPingpong>
struct TileConfig {
  using Tile = cute::Shape<cute::Int<kM>, cute::Int<kN>, cute::_64>;
  using Cluster = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using Kernel = cute::conditional_t<kPingpong,
                                     cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                     cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using Epilogue = cute::conditional_t<kPingpong,
                                       cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                       cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
};

using Pingpong128x128C2x1 = TileConfig<128, 128, 2, 1, true>;
using Cooperative128x256C2x1 = TileConfig<128, 256, 2, 1, false>;
using Cooperative256x128C2x1 = TileConfig<256, 128, 2, 1, false>;
using Cooperative128x256C1x2 = TileConfig<128, 256, 1, 2, false>;
// Session 28 (varlen-M bf16 kinds only, for the sweep): both operands multicast over a 2 x 2
// cluster (half the A and half the B bytes from L2 per CTA), the 128 x 256 tile without a
// cluster, and ping-pong on 64 x 256 tiles (each consumer runs m64n256 wgmmas, as in the
// cooperative 128 x 256 tile, and its epilogue hides under the other's mainloop: down_proj's
// short contraction, K = n, leaves the cooperative tile's epilogue exposed).
using Cooperative128x256C2x2 = TileConfig<128, 256, 2, 2, false>;
using Cooperative128x256C1x1 = TileConfig<128, 256, 1, 1, false>;
using Pingpong64x256C2x1 = TileConfig<64, 256, 2, 1, true>;
// Session 35 (varlen-M bf16 kinds, for the sweep): the two ping-pong tiles without a cluster.
// Without one the 128 x 256 cooperative tile won at every shape swept since session 28 (all 132
// SMs take tiles, and no expert's M blocks are rounded up to even); ping-pong was only ever timed
// over a 2 x 1 cluster. down_proj (K = n = 256: four K blocks per tile) runs at 0.66-0.71x a
// dense matmul of its shape on the H200, its cooperative epilogue exposed after each tile.
using Pingpong128x128C1x1 = TileConfig<128, 128, 1, 1, true>;
using Pingpong64x256C1x1 = TileConfig<64, 256, 1, 1, true>;

// LayoutA / LayoutB in CUTLASS 2.x terms: A is (M, K), B is (K, N); D is always row-major.
template <class LayoutA, class LayoutB, class ElementD, class Config>
struct GroupedGemm {
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using ElementAB = cutlass::bfloat16_t;
  using Out = ElementD;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile,
      typename Config::Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, typename Config::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB,
      ElementAB, LayoutB*, kAlignAB, float, typename Config::Tile, typename Config::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::Kernel>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  // Device-built argument arrays, carved out of the front of the workspace.
  struct Args {
    Shape* shapes;
    const ElementAB** a;
    const ElementAB** b;
    ElementD** d;
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
  };

  static constexpr size_t kAlign = 256;
  static size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

  static size_t args_bytes(int e) {
    return round_up(e * sizeof(Shape)) + 3 * round_up(e * sizeof(void*)) +
           round_up(e * sizeof(StrideA)) + round_up(e * sizeof(StrideB)) +
           round_up(e * sizeof(StrideD));
  }

  static Args carve(void* ws, int e) {
    char* p = static_cast<char*>(ws);
    Args r;
    r.shapes = reinterpret_cast<Shape*>(p); p += round_up(e * sizeof(Shape));
    r.a = reinterpret_cast<const ElementAB**>(p); p += round_up(e * sizeof(void*));
    r.b = reinterpret_cast<const ElementAB**>(p); p += round_up(e * sizeof(void*));
    r.d = reinterpret_cast<ElementD**>(p); p += round_up(e * sizeof(void*));
    r.sa = reinterpret_cast<StrideA*>(p); p += round_up(e * sizeof(StrideA));
    r.sb = reinterpret_cast<StrideB*>(p); p += round_up(e * sizeof(StrideB));
    r.sd = reinterpret_cast<StrideD*>(p);
    return r;
  }

  static cutlass::KernelHardwareInfo hw_info() {
    int device = 0;
    cudaGetDevice(&device);
    // One query per device: the SM count never changes and the call costs microseconds.
    static thread_local int cached_device = -1;
    static thread_local int cached_sms = 0;
    if (device != cached_device) {
      cached_sms = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
      cached_device = device;
    }
    cutlass::KernelHardwareInfo info;
    info.device_id = device;
    info.sm_count = cached_sms;
    return info;
  }

  static typename Gemm::Arguments make_arguments(const Args& args, int e) {
    typename Gemm::Arguments arguments;
    arguments.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    arguments.problem_shape = {e, args.shapes, nullptr};  // shapes live on the device only
    arguments.mainloop = {args.a, args.sa, args.b, args.sb};
    arguments.epilogue.thread.alpha = 1.0f;
    arguments.epilogue.thread.beta = 0.0f;
    arguments.epilogue.ptr_C = nullptr;
    arguments.epilogue.dC = nullptr;
    arguments.epilogue.ptr_D = args.d;
    arguments.epilogue.dD = args.sd;
    arguments.hw_info = hw_info();
    return arguments;
  }

  static size_t workspace_bytes(int e) {
    Args dummy{};
    auto arguments = make_arguments(dummy, e);
    return args_bytes(e) + round_up(Gemm::get_workspace_size(arguments));
  }

  // Builds the argument arrays with `build` (a kernel launch) and runs the GEMM.
  template <class BuildFn>
  static std::string run(const GroupedGemmParams& p, cudaStream_t stream, BuildFn build) {
    const int e = p.num_groups;
    size_t need = workspace_bytes(e);
    if (p.workspace_bytes < need) {
      return "workspace too small: " + std::to_string(p.workspace_bytes) + " < " +
             std::to_string(need) + " bytes";
    }
    Args args = carve(p.workspace, e);
    build(args);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return std::string("argument kernel: ") + cudaGetErrorString(err);
    auto arguments = make_arguments(args, e);
    void* gemm_ws = static_cast<char*>(p.workspace) + args_bytes(e);
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(arguments);
    if (st != cutlass::Status::kSuccess) {
      return std::string("CUTLASS can_implement: ") + cutlassGetStatusString(st);
    }
    st = gemm.initialize(arguments, gemm_ws, stream);
    if (st != cutlass::Status::kSuccess) {
      return std::string("CUTLASS initialize: ") + cutlassGetStatusString(st);
    }
    st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess) {
      return std::string("CUTLASS run: ") + cutlassGetStatusString(st);
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return std::string("CUTLASS launch: ") + cudaGetErrorString(err);
    return {};
  }
};

// Group e: D[off_e : off_e + m_e, :N] = A[off_e : off_e + m_e, :K] · op(B_e), B_e = b + e·K·N.
template <class G>
__global__ void build_varlen_m_args(typename G::Args args, const int32_t* offsets, int e_count,
                                    int n, int k, const typename G::ElementAB* a,
                                    const typename G::ElementAB* b, typename G::Out* d) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= e_count) return;
  int start = offsets[e];
  int rows = offsets[e + 1] - start;
  args.shapes[e] = cute::make_shape(rows, n, k);
  args.a[e] = a + int64_t(start) * k;
  args.b[e] = b + int64_t(e) * k * n;
  args.d[e] = d + int64_t(start) * n;
  args.sa[e] = cutlass::make_cute_packed_stride(typename G::StrideA{}, {rows, k, 1});
  args.sb[e] = cutlass::make_cute_packed_stride(typename G::StrideB{}, {n, k, 1});
  args.sd[e] = cutlass::make_cute_packed_stride(typename G::StrideD{}, {rows, n, 1});
}

// Group e: D_e (M, N) = A[off_e : off_e + k_e, :M]ᵀ · B[off_e : off_e + k_e, :N], D_e = d + e·M·N.
// A is read as a column-major (M, k_e) matrix and B as a row-major (k_e, N) one; k_e = 0 gives
// zeros (the epilogue still runs).
template <class G>
__global__ void build_varlen_k_args(typename G::Args args, const int32_t* offsets, int e_count,
                                    int m, int n, const typename G::ElementAB* a,
                                    const typename G::ElementAB* b, typename G::Out* d) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= e_count) return;
  int start = offsets[e];
  int rows = offsets[e + 1] - start;
  args.shapes[e] = cute::make_shape(m, n, rows);
  args.a[e] = a + int64_t(start) * m;
  args.b[e] = b + int64_t(start) * n;
  args.d[e] = d + int64_t(e) * m * n;
  args.sa[e] = cutlass::make_cute_packed_stride(typename G::StrideA{}, {m, rows, 1});
  args.sb[e] = cutlass::make_cute_packed_stride(typename G::StrideB{}, {n, rows, 1});
  args.sd[e] = cutlass::make_cute_packed_stride(typename G::StrideD{}, {m, n, 1});
}

template <class G>
std::string launch_varlen_m(const GroupedGemmParams& p, cudaStream_t stream) {
  return G::run(p, stream, [&](const typename G::Args& args) {
    int threads = 128, blocks = (p.num_groups + threads - 1) / threads;
    build_varlen_m_args<G><<<blocks, threads, 0, stream>>>(
        args, p.group_offsets, p.num_groups, p.n, p.k,
        static_cast<const typename G::ElementAB*>(p.a),
        static_cast<const typename G::ElementAB*>(p.b), static_cast<typename G::Out*>(p.d));
  });
}

template <class G>
std::string launch_varlen_k(const GroupedGemmParams& p, cudaStream_t stream) {
  return G::run(p, stream, [&](const typename G::Args& args) {
    int threads = 128, blocks = (p.num_groups + threads - 1) / threads;
    build_varlen_k_args<G><<<blocks, threads, 0, stream>>>(
        args, p.group_offsets, p.num_groups, p.m, p.n,
        static_cast<const typename G::ElementAB*>(p.a),
        static_cast<const typename G::ElementAB*>(p.b), static_cast<typename G::Out*>(p.d));
  });
}

// Workspace bytes / launch of one (GemmKind, GemmConfig) instantiation; the TUs list theirs.
template <class G>
struct VarlenM {
  static size_t workspace_bytes(int e) { return G::workspace_bytes(e); }
  static std::string run(const GroupedGemmParams& p, cudaStream_t s) {
    return launch_varlen_m<G>(p, s);
  }
};

template <class G>
struct VarlenK {
  static size_t workspace_bytes(int e) { return G::workspace_bytes(e); }
  static std::string run(const GroupedGemmParams& p, cudaStream_t s) {
    return launch_varlen_k<G>(p, s);
  }
};

inline std::string unsupported_config(const char* family, int config) {
  return std::string(family) + ": GEMM config " + std::to_string(config) +
         " is not instantiated for this kind (see csrc/sonic_ffi.h)";
}

}  // namespace sonic
