// The gathered varlen-K kind (kVarlenKGatherBf16): the weight gradients with x / dO rows read
// through gather_idx inside the GEMM (gather_wgrad.cuh), bf16 out, fp32 accumulation.
#include "gather_wgrad.cuh"

namespace sonic {

namespace detail {
template <class Config>
using WgradBf16 = gather::WgradLauncher<gather::GatherWgrad<cutlass::bfloat16_t, Config>>;
}  // namespace detail
using namespace detail;

// Two schedules: both operands by cp.async (5), or B by TMA multicast over a 2 x 1 cluster (6;
// B must not be gathered: dW1's dH).
template <class Fn>
static bool dispatch_wgrad(int config, Fn fn) {
  switch (config) {
    case 5: fn(WgradBf16<gather::GatherCoop128x256>{}); return true;
    case 6: fn(WgradBf16<gather::GatherTmaB128x256C2x1>{}); return true;
    default: return false;
  }
}

size_t varlen_k_gather_workspace_bytes(int config, int num_groups) {
  size_t bytes = 0;
  dispatch_wgrad(config, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_k_gather(int config, const GroupedGemmParams& p, const int32_t* a_idx,
                                const int32_t* b_idx, int64_t a_rows, int64_t b_rows,
                                cudaStream_t stream) {
  std::string err;
  if (!dispatch_wgrad(config, [&](auto g) { err = g.run(p, a_idx, b_idx, a_rows, b_rows, stream); })) {
    return unsupported_config("gathered varlen-K", config);
  }
  return err;
}

bool varlen_k_gather_layouts_ok() {
  bool ok = true;
  for (int config : {5, 6}) {
    dispatch_wgrad(config, [&](auto g) { ok = ok && decltype(g)::Gemm::layout_ok(); });
  }
  return ok;
}

}  // namespace sonic
