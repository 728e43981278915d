// Varlen-M grouped GEMM, B_e (N, K) row-major used transposed, bf16 output: dx_pairs (dH·W1ᵀ).
#include "gather_gemm.cuh"
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
template <class Config>
using NTbf16 = VarlenM<GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                                    cutlass::bfloat16_t, Config>>;
// Config 14: gather_gemm.cuh's kernel with A and B_e by TMA (no gather, no per-group tensor maps).
template <class Config>
using TmaNT = gather::Launcher<gather::GatherGemm<true, cutlass::bfloat16_t, Config,
                                                  gather::Epi::kStore>>;
}  // namespace detail
using namespace detail;
using gather::TmaAB128x256C1;

template <class Fn>
static bool dispatch_nt_bf16(int config, Fn fn) {
  switch (config) {
    case 0: fn(NTbf16<Pingpong128x128C2x1>{}); return true;
    case 1: fn(NTbf16<Cooperative128x256C2x1>{}); return true;
    case 2: fn(NTbf16<Cooperative256x128C2x1>{}); return true;
    case 10: fn(NTbf16<Cooperative128x256C2x2>{}); return true;
    case 11: fn(NTbf16<Cooperative128x256C1x1>{}); return true;
    case 12: fn(NTbf16<Pingpong64x256C2x1>{}); return true;
    case 14: fn(TmaNT<TmaAB128x256C1>{}); return true;
    case 18: fn(NTbf16<Pingpong128x128C1x1>{}); return true;
    case 19: fn(NTbf16<Pingpong64x256C1x1>{}); return true;
    default: return false;
  }
}

bool varlen_m_nt_bf16_layouts_ok() { return TmaNT<TmaAB128x256C1>::Gemm::layouts_ok(); }

size_t varlen_m_nt_bf16_workspace_bytes(int config, int num_groups) {
  size_t bytes = 0;
  dispatch_nt_bf16(config, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_m_nt_bf16(int config, const GroupedGemmParams& p, cudaStream_t stream) {
  std::string err;
  if (!dispatch_nt_bf16(config, [&](auto g) { err = g.run(p, stream); })) {
    return unsupported_config("varlen-M NT", config);
  }
  return err;
}

}  // namespace sonic
