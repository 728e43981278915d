// Varlen-K grouped GEMM for the weight gradients: dW1_e = Xgᵀ·dH, dW2_e = A'ᵀ·dOg (fp32
// accumulation; fp32 or bf16 out).
#include <type_traits>

#include "gather_wgrad.cuh"
#include "grouped_gemm.cuh"

namespace sonic {
namespace detail {
template <class Out, class Config>
using VK = VarlenK<GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, Out,
                               Config>>;
// Config 14 (bf16 out): gather_wgrad.cuh's kernel with both operands by TMA (neither gathered,
// no per-group tensor maps), rows p of a and b for p in [0, P).
template <class Config>
struct TmaVK {
  using Gemm = gather::GatherWgrad<cutlass::bfloat16_t, Config, 3>;
  using Launcher = gather::WgradLauncher<Gemm>;
  static size_t workspace_bytes(int e) { return Launcher::workspace_bytes(e); }
  static std::string run(const GroupedGemmParams& p, cudaStream_t stream) {
    if (p.src_rows < 1) return "varlen-K by TMA needs the rows of a and b (src_rows)";
    return Launcher::run(p, nullptr, nullptr, p.src_rows, p.src_rows, stream);
  }
};
}  // namespace detail
using namespace detail;
using gather::TmaAB128x256C1;

template <class Out, class Fn>
static bool dispatch_k(int config, Fn fn) {
  switch (config) {
    case 0: fn(VK<Out, Pingpong128x128C2x1>{}); return true;
    case 3: fn(VK<Out, Cooperative128x256C1x2>{}); return true;
    default: break;
  }
  // bf16 out only (session 28, for the sweep): the 128 x 256 tile with the N-side operand's
  // tile multicast over a 2 x 1 cluster, both operands' over a 2 x 2 one, or no cluster; and
  // (session 29) our TMA kernel.
  if constexpr (std::is_same_v<Out, cutlass::bfloat16_t>) {
    switch (config) {
      case 1: fn(VK<Out, Cooperative128x256C2x1>{}); return true;
      case 10: fn(VK<Out, Cooperative128x256C2x2>{}); return true;
      case 11: fn(VK<Out, Cooperative128x256C1x1>{}); return true;
      case 14: fn(TmaVK<TmaAB128x256C1>{}); return true;
      default: break;
    }
  }
  return false;
}

template <class Fn>
static bool dispatch_k(bool f32_out, int config, Fn fn) {
  return f32_out ? dispatch_k<float>(config, fn) : dispatch_k<cutlass::bfloat16_t>(config, fn);
}

bool varlen_k_layouts_ok() { return TmaVK<TmaAB128x256C1>::Gemm::layout_ok(); }

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
