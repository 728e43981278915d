// Varlen-K grouped GEMM for the weight gradients: dW1_e = Xgᵀ·dH, dW2_e = A'ᵀ·dOg (fp32 out).
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
using VarlenK = GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float,
                            CooperativeVarlenKConfig>;
}  // namespace detail
using namespace detail;

size_t varlen_k_workspace_bytes(int num_groups) { return VarlenK::workspace_bytes(num_groups); }

std::string run_varlen_k(const GroupedGemmParams& p, cudaStream_t stream) {
  return launch_varlen_k<VarlenK>(p, stream);
}

}  // namespace sonic
