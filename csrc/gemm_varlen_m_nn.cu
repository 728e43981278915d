// Varlen-M grouped GEMM, B_e (K, N) row-major: up_proj (x·W1 -> H) and down_proj (A·W2).
#include "gather_gemm.cuh"
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
using RowMajor = cutlass::layout::RowMajor;
using Bf16 = cutlass::bfloat16_t;
template <class Out, class Config>
using NN = VarlenM<GroupedGemm<RowMajor, RowMajor, Out, Config>>;
// Config 14: gather_gemm.cuh's kernel with A and B_e by TMA (no gather, no per-group tensor maps).
template <class Config>
using TmaNN = gather::Launcher<gather::GatherGemm<false, cutlass::bfloat16_t, Config,
                                                  gather::Epi::kStore>>;
}  // namespace detail
using namespace detail;
using gather::TmaAB128x256C1;

// fp32 output (version 1's up_proj accumulator): ping-pong only, kept for comparisons.
template <class Fn>
static bool dispatch_nn(bool f32_out, int config, Fn fn) {
  if (f32_out) {
    if (config == 0) { fn(NN<float, Pingpong128x128C2x1>{}); return true; }
  } else {
    switch (config) {
      case 0: fn(NN<Bf16, Pingpong128x128C2x1>{}); return true;
      case 1: fn(NN<Bf16, Cooperative128x256C2x1>{}); return true;
      case 2: fn(NN<Bf16, Cooperative256x128C2x1>{}); return true;
      case 10: fn(NN<Bf16, Cooperative128x256C2x2>{}); return true;
      case 11: fn(NN<Bf16, Cooperative128x256C1x1>{}); return true;
      case 12: fn(NN<Bf16, Pingpong64x256C2x1>{}); return true;
      case 14: fn(TmaNN<TmaAB128x256C1>{}); return true;
      case 18: fn(NN<Bf16, Pingpong128x128C1x1>{}); return true;
      case 19: fn(NN<Bf16, Pingpong64x256C1x1>{}); return true;
      default: return false;
    }
  }
  return false;
}

bool varlen_m_nn_layouts_ok() { return TmaNN<TmaAB128x256C1>::Gemm::layouts_ok(); }

size_t varlen_m_nn_workspace_bytes(bool f32_out, int config, int num_groups) {
  size_t bytes = 0;
  dispatch_nn(f32_out, config, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_m_nn(bool f32_out, int config, const GroupedGemmParams& p,
                            cudaStream_t stream) {
  std::string err;
  if (!dispatch_nn(f32_out, config, [&](auto g) { err = g.run(p, stream); })) {
    return unsupported_config("varlen-M NN", config);
  }
  return err;
}

}  // namespace sonic
