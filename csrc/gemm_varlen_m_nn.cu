// Varlen-M grouped GEMM, B_e (K, N) row-major: up_proj (x·W1) and down_proj (A·W2).
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
using RowMajor = cutlass::layout::RowMajor;
using NNF32 = GroupedGemm<RowMajor, RowMajor, float, PingpongConfig>;
using NNBf16 = GroupedGemm<RowMajor, RowMajor, cutlass::bfloat16_t, PingpongConfig>;
}  // namespace detail
using namespace detail;

size_t varlen_m_nn_workspace_bytes(bool f32_out, int num_groups) {
  return f32_out ? NNF32::workspace_bytes(num_groups) : NNBf16::workspace_bytes(num_groups);
}

std::string run_varlen_m_nn(bool f32_out, const GroupedGemmParams& p, cudaStream_t stream) {
  return f32_out ? launch_varlen_m<NNF32>(p, stream) : launch_varlen_m<NNBf16>(p, stream);
}

}  // namespace sonic
