// The plain gathered kinds (GitHub issue #5): D[p, :] = src[gather_idx[p], :] · op(B_e) with the
// cp.async row-gather GEMM of gather_gemm.cuh and its plain epilogue (kStore):
// kVarlenMGatherNNBf16 (up_proj's H, bf16) and kVarlenMGatherNTF32 (dh's dA', fp32).
#include "gather_gemm.cuh"

namespace sonic {

namespace detail {
template <class Config>
using GatherNN =
    gather::Launcher<gather::GatherGemm<false, cutlass::bfloat16_t, Config, gather::Epi::kStore>>;
template <class Config>
using GatherNT = gather::Launcher<gather::GatherGemm<true, float, Config, gather::Epi::kStore>>;
}  // namespace detail
using namespace detail;
// GatherNN: kVarlenMGatherNNBf16 (up_proj, x rows gathered, W1_e (K, N), bf16 H); GatherNT:
// kVarlenMGatherNTF32 (dh, dO rows gathered, W2_e (N, K) used transposed, fp32 dA').
using gather::dispatch_config;

size_t varlen_m_gather_workspace_bytes(bool nt_f32, int config, int num_groups) {
  size_t bytes = 0;
  auto query = [&](auto g) { bytes = g.workspace_bytes(num_groups); };
  if (nt_f32) {
    dispatch_config<GatherNT>(config, query);
  } else {
    dispatch_config<GatherNN>(config, query);
  }
  return bytes;
}

std::string run_varlen_m_gather(bool nt_f32, int config, const GroupedGemmParams& p,
                                cudaStream_t stream) {
  if (p.gather_idx == nullptr) return "varlen-M gather: no gather indices";
  std::string err;
  auto launch = [&](auto g) { err = g.run(p, stream); };
  const bool found = nt_f32 ? dispatch_config<GatherNT>(config, launch)
                            : dispatch_config<GatherNN>(config, launch);
  if (!found) return unsupported_config("varlen-M gather", config);
  return err;
}

bool varlen_m_gather_layouts_ok() { return gather::all_layouts_ok<GatherNN, GatherNT>(); }

}  // namespace sonic
