// Varlen-M grouped GEMM, B_e (N, K) row-major used transposed, fp32 output: dh (dO·W2ᵀ -> dA').
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
template <class Config>
using NTf32 = VarlenM<GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                                    float, Config>>;
}  // namespace detail
using namespace detail;

template <class Fn>
static bool dispatch_nt_f32(int config, Fn fn) {
  switch (config) {
    case 0: fn(NTf32<Pingpong128x128C2x1>{}); return true;
    case 1: fn(NTf32<Cooperative128x256C2x1>{}); return true;
    case 2: fn(NTf32<Cooperative256x128C2x1>{}); return true;
    case 11: fn(NTf32<Cooperative128x256C1x1>{}); return true;
    default: return false;
  }
}

size_t varlen_m_nt_f32_workspace_bytes(int config, int num_groups) {
  size_t bytes = 0;
  dispatch_nt_f32(config, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_m_nt_f32(int config, const GroupedGemmParams& p, cudaStream_t stream) {
  std::string err;
  if (!dispatch_nt_f32(config, [&](auto g) { err = g.run(p, stream); })) {
    return unsupported_config("varlen-M NT", config);
  }
  return err;
}

}  // namespace sonic
