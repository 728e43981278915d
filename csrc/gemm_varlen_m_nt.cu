// Varlen-M grouped GEMM, B_e (N, K) row-major used transposed: dh (dO·W2ᵀ), dx_pairs (dH·W1ᵀ).
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
using NTF32 = GroupedGemm<RowMajor, ColumnMajor, float, PingpongConfig>;
using NTBf16 = GroupedGemm<RowMajor, ColumnMajor, cutlass::bfloat16_t, PingpongConfig>;
}  // namespace detail
using namespace detail;

size_t varlen_m_nt_workspace_bytes(bool f32_out, int num_groups) {
  return f32_out ? NTF32::workspace_bytes(num_groups) : NTBf16::workspace_bytes(num_groups);
}

std::string run_varlen_m_nt(bool f32_out, const GroupedGemmParams& p, cudaStream_t stream) {
  return f32_out ? launch_varlen_m<NTF32>(p, stream) : launch_varlen_m<NTBf16>(p, stream);
}

}  // namespace sonic
