// Varlen-K grouped GEMM for the weight gradients: dW1_e = Xgᵀ·dH, dW2_e = A'ᵀ·dOg (fp32
// accumulation; fp32 or bf16 out).
#include <type_traits>

#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
template <class Out, class Config>
using VK = VarlenK<GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, Out,
                               Config>>;
}  // namespace detail
using namespace detail;

template <class Out, class Fn>
static bool dispatch_k(int config, Fn fn) {
  switch (config) {
    case 0: fn(VK<Out, Pingpong128x128C2x1>{}); return true;
    case 3: fn(VK<Out, Cooperative128x256C1x2>{}); return true;
    default: break;
  }
  // bf16 out only (session 28, for the sweep): the 128 x 256 tile with the N-side operand's
  // tile multicast over a 2 x 1 cluster, both operands' over a 2 x 2 one, or no cluster.
  if constexpr (std::is_same_v<Out, cutlass::bfloat16_t>) {
    switch (config) {
      case 1: fn(VK<Out, Cooperative128x256C2x1>{}); return true;
      case 10: fn(VK<Out, Cooperative128x256C2x2>{}); return true;
      case 11: fn(VK<Out, Cooperative128x256C1x1>{}); return true;
      default: break;
    }
  }
  return false;
}

template <class Fn>
static bool dispatch_k(bool f32_out, int config, Fn fn) {
  return f32_out ? dispatch_k<float>(config, fn) : dispatch_k<cutlass::bfloat16_t>(config, fn);
}

size_t varlen_k_workspace_bytes(bool f32_out, int config, int num_groups) {
  size_t bytes = 0;
  dispatch_k(f32_out, config, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_k(bool f32_out, int config, const GroupedGemmParams& p,
                         cudaStream_t stream) {
  std::string err;
  if (!dispatch_k(f32_out, config, [&](auto g) { err = g.run(p, stream); })) {
    return unsupported_config("varlen-K", config);
  }
  return err;
}

}  // namespace sonic
