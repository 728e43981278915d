// The fused-epilogue kinds (GitHub issue #5): the cp.async row-gather GEMM of gather_gemm.cuh with
// the SwiGLU epilogue (up_proj: H and A from the accumulators, no fp32 or bf16 H read back) and
// the dSwiGLU epilogue (dh: dH, A' and dS from dA' without writing it in fp32 and reading it
// back). A rows come through gather_idx, or are read in order when it is null.
#include "gather_gemm.cuh"

namespace sonic {

namespace detail {
template <class Config>
using SwigluNN = gather::Launcher<
    gather::GatherGemm<false, cutlass::bfloat16_t, Config, gather::Epi::kSwiGLU>>;
template <class Config>
using DSwigluNT =
    gather::Launcher<gather::GatherGemm<true, float, Config, gather::Epi::kDSwiGLU>>;
}  // namespace detail
using namespace detail;
// SwigluNN: kVarlenMGatherSwiGLU; DSwigluNT: kVarlenMGatherDSwiGLU.
using gather::dispatch_config;

// kVarlenMGatherSwiGLU's schedules: the gather configs, and configs 14 and 17 (A, already
// gathered, and W1_e by TMA: up_proj's SwiGLU in the epilogue of the GEMM over the gathered copy
// of x that dW1 shares; no gather_idx), cooperative or ping-pong.
template <class Fn>
static bool dispatch_swiglu(int config, Fn fn) {
  if (config == static_cast<int>(GemmConfig::kTmaAB128x256C1)) {
    fn(SwigluNN<gather::TmaAB128x256C1>{});
    return true;
  }
  if (config == static_cast<int>(GemmConfig::kTmaABPingpong64x256C1)) {
    fn(SwigluNN<gather::TmaABPingpong64x256C1>{});
    return true;
  }
  return dispatch_config<SwigluNN>(config, fn);
}

int fused_epilogue_tile_n(GemmKind kind, int config) {
  int tile_n = 0;
  auto query = [&](auto g) { tile_n = decltype(g)::Gemm::kTileN; };
  if (kind == GemmKind::kVarlenMGatherSwiGLU) dispatch_swiglu(config, query);
  if (kind == GemmKind::kVarlenMGatherDSwiGLU) dispatch_config<DSwigluNT>(config, query);
  return tile_n;
}

size_t varlen_m_fused_workspace_bytes(bool dswiglu, int config, int num_groups) {
  size_t bytes = 0;
  auto query = [&](auto g) { bytes = g.workspace_bytes(num_groups); };
  if (dswiglu) {
    dispatch_config<DSwigluNT>(config, query);
  } else {
    dispatch_swiglu(config, query);
  }
  return bytes;
}

std::string run_varlen_m_fused(bool dswiglu, int config, const GroupedGemmParams& p,
                               cudaStream_t stream) {
  if (dswiglu && (p.h_in == nullptr || p.scores == nullptr || p.dh_out == nullptr ||
                  p.a_prime_out == nullptr || p.ds_part == nullptr)) {
    return "varlen-M dSwiGLU: missing H, scores or an output";
  }
  if (!dswiglu && p.a_out == nullptr) return "varlen-M SwiGLU: missing the A output";
  std::string err;
  auto launch = [&](auto g) { err = g.run(p, stream); };
  const bool found = dswiglu ? dispatch_config<DSwigluNT>(config, launch)
                             : dispatch_swiglu(config, launch);
  if (!found) return unsupported_config("varlen-M fused epilogue", config);
  return err;
}

bool varlen_m_fused_layouts_ok() {
  return gather::all_layouts_ok<SwigluNN, DSwigluNT>() &&
         SwigluNN<gather::TmaAB128x256C1>::Gemm::layouts_ok() &&
         SwigluNN<gather::TmaABPingpong64x256C1>::Gemm::layouts_ok();
}

}  // namespace sonic
