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

// fn(the TMA schedule Config): the operand read in order by TMA, B when b_idx is null (dW1's
// dH), else A when a_idx is null (dW2's A').
template <class Config, class Fn>
static bool dispatch_tma_side(bool a_gathered, bool b_gathered, Fn fn) {
  if (!b_gathered) {
    fn(WgradBf16<Config, 2>{});
  } else if (!a_gathered) {
    fn(WgradBf16<Config, 1>{});
  } else {
    return false;
  }
  return true;
}

// Four schedules: both operands by cp.async (5), or the operand read in order by TMA on a
// 128 x 256 (6) or 256 x 128 (8) tile over a 2-CTA cluster, or on 256 x 128 without one (9).
// `b_gathered` / `a_gathered` pick the side of 6, 8 and 9 (a query passes false, false).
template <class Fn>
static bool dispatch_wgrad(int config, bool a_gathered, bool b_gathered, Fn fn) {
  switch (config) {
    case 5: fn(WgradBf16<gather::GatherCoop128x256, 0>{}); return true;
    case 6:
      return dispatch_tma_side<gather::GatherTmaB128x256C2x1>(a_gathered, b_gathered, fn);
    case 8:
      return dispatch_tma_side<gather::GatherTma256x128C2x1>(a_gathered, b_gathered, fn);
    case 9:
      return dispatch_tma_side<gather::GatherTma256x128C1>(a_gathered, b_gathered, fn);
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
    return config == 6 || config == 8 || config == 9
               ? "gathered varlen-K configs 6, 8 and 9 read one operand in order: a_idx or "
                 "b_idx must be null"
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
  dispatch_wgrad(8, true, false, check);
  dispatch_wgrad(8, false, true, check);
  dispatch_wgrad(9, true, false, check);
  dispatch_wgrad(9, false, true, check);
  return ok;
}

}  // namespace sonic
