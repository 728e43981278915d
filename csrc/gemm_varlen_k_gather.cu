// The gathered varlen-K kind (kVarlenKGatherBf16): the weight gradients with x / dO rows read
// through gather_idx inside the GEMM (gather_wgrad.cuh), bf16 out, fp32 accumulation.
#include "gather_wgrad.cuh"

namespace sonic {

namespace detail {
template <class Config, int kTmaSide>
using WgradBf16 =
    gather::WgradLauncher<gather::GatherWgrad<cutlass::bfloat16_t, Config, kTmaSide>>;
}  // namespace detail
using namespace detail;

// Two schedules: both operands by cp.async (5), or the operand read in order by TMA multicast
// over a 2-CTA cluster (6): B when b_idx is null (dW1's dH), else A when a_idx is null (dW2's
// A'). `b_gathered` / `a_gathered` pick the side of config 6 (a query passes false, false).
template <class Fn>
static bool dispatch_wgrad(int config, bool a_gathered, bool b_gathered, Fn fn) {
  switch (config) {
    case 5: fn(WgradBf16<gather::GatherCoop128x256, 0>{}); return true;
    case 6:
      if (!b_gathered) {
        fn(WgradBf16<gather::GatherTmaB128x256C2x1, 2>{});
      } else if (!a_gathered) {
        fn(WgradBf16<gather::GatherTmaB128x256C2x1, 1>{});
      } else {
        return false;
      }
      return true;
    default: return false;
  }
}

size_t varlen_k_gather_workspace_bytes(int config, int num_groups) {
  size_t bytes = 0;
  dispatch_wgrad(config, false, false, [&](auto g) { bytes = g.workspace_bytes(num_groups); });
  return bytes;
}

std::string run_varlen_k_gather(int config, const GroupedGemmParams& p, const int32_t* a_idx,
                                const int32_t* b_idx, int64_t a_rows, int64_t b_rows,
                                cudaStream_t stream) {
  std::string err;
  const bool found = dispatch_wgrad(config, a_idx != nullptr, b_idx != nullptr, [&](auto g) {
    err = g.run(p, a_idx, b_idx, a_rows, b_rows, stream);
  });
  if (!found) {
    return config == 6 ? "gathered varlen-K config 6 reads one operand in order: a_idx or b_idx "
                         "must be null"
                       : unsupported_config("gathered varlen-K", config);
  }
  return err;
}

bool varlen_k_gather_layouts_ok() {
  bool ok = true;
  auto check = [&](auto g) { ok = ok && decltype(g)::Gemm::layout_ok(); };
  dispatch_wgrad(5, true, true, check);
  dispatch_wgrad(6, true, false, check);  // B by TMA
  dispatch_wgrad(6, false, true, check);  // A by TMA
  return ok;
}

}  // namespace sonic
