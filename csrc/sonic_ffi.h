// Internal interface between the FFI handlers (ffi_handlers.cu) and the kernel translation units.
// No CUTLASS or XLA types here, so the handler TU compiles without the CUTLASS templates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace sonic {

// A GEMM family: one CUTLASS instantiation (layouts, output type, tile config).
enum class GemmKind : int {
  kVarlenMNNF32 = 0,   // D[rows_e, N] = A[rows_e, K] · B_e,  B_e (K, N) row-major, D fp32
  kVarlenMNNBf16 = 1,  // same, D bf16
  kVarlenMNTF32 = 2,   // D[rows_e, N] = A[rows_e, K] · B_eᵀ, B_e (N, K) row-major, D fp32
  kVarlenMNTBf16 = 3,  // same, D bf16
  kVarlenKF32 = 4,     // D_e[M, N] = A[rows_e, M]ᵀ · B[rows_e, N], D (E, M, N) fp32
  // A rows gathered in the mainloop (cp.async): D[p, N] = src[gather_idx[p], K] · op(B_e).
  kVarlenMGatherNNBf16 = 5,  // B_e (K, N) row-major, D bf16 (up_proj)
  kVarlenMGatherNTF32 = 6,   // B_e (N, K) row-major used transposed, D fp32 (dh)
  // Varlen-K with bf16 D (fp32 accumulation): the weight gradients in the weights' dtype,
  // without an fp32 (E, M, N) buffer and a cast pass over it.
  kVarlenKBf16 = 7,
  // The gathered GEMM with the SwiGLU epilogues fused (gather_gemm.cuh; gather_idx may be null:
  // A rows already gathered). Own FFI targets, since they have several outputs.
  kVarlenMGatherSwiGLU = 8,   // up_proj: src[idx] · W1_e (K, 2n) -> H (P, 2n) bf16, A (P, n) bf16
  kVarlenMGatherDSwiGLU = 9,  // dh: dO[idx] · W2_eᵀ, W2_e (n, K) -> dH, A', dS partial sums
  // Varlen-K with either operand's rows read through an index (gather_wgrad.cuh), bf16 D: dW1
  // from x[idx] and dH, dW2 from A' and dO[idx]. Own FFI target (two optional indices).
  kVarlenKGatherBf16 = 10,
  kNumKinds = 11,
};

// Tile schedule of a grouped GEMM (csrc/grouped_gemm.cuh). Not every kind instantiates every
// config: varlen-M bf16 kinds have 0-2, 10-12, 14, 18 and 19, kVarlenMNTF32 has 0-2 and 11,
// kVarlenMNNF32 has 0, varlen-K has 0 and 3 (both outputs) and 1, 10, 11, 14 (bf16), the gather
// kinds have 4, 5, 7 (cp.async producer, no cluster), 6 (B_e by TMA over a 2x1 cluster), 13
// (B_e by TMA, no cluster) and the ping-pong 15 and 16, the SwiGLU kind also 14 and 17, the
// gathered varlen-K kind has 5, 6, 8 and 9. The workspace query
// returns 0 for a pair that is not instantiated.
enum class GemmConfig : int {
  kPingpong128x128C2x1 = 0,
  kCooperative128x256C2x1 = 1,
  kCooperative256x128C2x1 = 2,
  kCooperative128x256C1x2 = 3,
  kGatherCoop128x128 = 4,
  kGatherCoop128x256 = 5,
  kGatherTmaB128x256C2x1 = 6,  // gather kinds: A by cp.async, B_e by TMA multicast (2x1)
  kGatherNoinc128x256 = 7,     // gather kinds: as 5, stages published by noinc arrivals
  kGatherTma256x128C2x1 = 8,   // gathered varlen-K: as 6 with a 256 x 128 tile (dW2)
  kGatherTma256x128C1 = 9,     // gathered varlen-K: as 8 without the cluster
  kCooperative128x256C2x2 = 10,  // varlen-M / varlen-K bf16: A and B multicast (2x2)
  kCooperative128x256C1x1 = 11,  // varlen-M, varlen-K bf16: no cluster
  kPingpong64x256C2x1 = 12,      // varlen-M bf16: ping-pong, m64n256 per consumer
  kGatherTmaB128x256C1 = 13,     // gather kinds: as 6 without the cluster
  kTmaAB128x256C1 = 14,          // varlen-M / varlen-K bf16: our kernels, both operands by TMA
  // Ping-pong on 64 x 256 tiles (one consumer warpgroup per tile, each one's epilogue under the
  // other's mainloop): the gather and fused-epilogue kinds with B_e by TMA over a 2 x 1 cluster
  // (15) or without one (16); the SwiGLU kind over rows in order with A by TMA too (17).
  kGatherPingpong64x256C2x1 = 15,
  kGatherPingpong64x256C1 = 16,
  kTmaABPingpong64x256C1 = 17,
  // Varlen-M bf16 (session 35): CUTLASS's ping-pong without a cluster, on 128 x 128 and 64 x 256
  // tiles (the cooperative tile beat its 2 x 1 cluster form at every shape swept since session 28).
  kPingpong128x128C1x1 = 18,
  kPingpong64x256C1x1 = 19,
  kNumConfigs = 20,
};

// Operands of one grouped GEMM; all pointers are device pointers.
// Group e owns rows [group_offsets[e], group_offsets[e+1]) of the row-indexed operands;
// group_offsets is read on the device only.
struct GroupedGemmParams {
  const void* a;
  const void* b;
  void* d;
  const int32_t* group_offsets;  // (E + 1,)
  int num_groups;                // E
  int m;                         // varlen-K only: rows of each D_e
  int n;
  int k;                         // varlen-M only: the reduction size
  void* workspace;
  size_t workspace_bytes;
  const int32_t* gather_idx = nullptr;  // gather kinds: (P,), row p of A is a[gather_idx[p]]
  int64_t src_rows = 0;                 // gather kinds: rows of a (T); other indices read zeros
  // Fused-epilogue kinds (n = the SwiGLU width, N of dA' and half of H's 2n columns):
  void* h_out = nullptr;                // kVarlenMGatherSwiGLU: H (P, 2n), null = A only
  void* a_out = nullptr;                // kVarlenMGatherSwiGLU: A (P, n)
  const void* h_in = nullptr;           // kVarlenMGatherDSwiGLU: H (P, 2n)
  const float* scores = nullptr;        // kVarlenMGatherDSwiGLU: s (P,)
  void* dh_out = nullptr;               // kVarlenMGatherDSwiGLU: dH (P, 2n)
  void* a_prime_out = nullptr;          // kVarlenMGatherDSwiGLU: A' (P, n)
  float* ds_part = nullptr;             // kVarlenMGatherDSwiGLU: (P, ceil(n / tile N)) fp32
};

inline bool is_gather_kind(GemmKind k) {
  return k == GemmKind::kVarlenMGatherNNBf16 || k == GemmKind::kVarlenMGatherNTF32;
}

inline bool is_fused_epilogue_kind(GemmKind k) {
  return k == GemmKind::kVarlenMGatherSwiGLU || k == GemmKind::kVarlenMGatherDSwiGLU;
}

// Output columns of one tile of a fused-epilogue kind (the width of dS_part is ceil(n / this)):
// config 4 (128x128) covers 64 columns of A with SwiGLU and 128 of dA' with dSwiGLU.
int fused_epilogue_tile_n(GemmKind kind, int config);

// Bytes of workspace `run_grouped_gemm` needs for `num_groups` groups on the current device,
// or 0 when (kind, config) is not instantiated.
size_t grouped_gemm_workspace_bytes(GemmKind kind, int config, int num_groups);

// Launches the grouped GEMM on `stream`; returns an empty string or an error message.
// Host work is only argument set-up (no sync, no data-dependent branches), so the launch can be
// captured into a CUDA graph (XLA command buffers).
std::string run_grouped_gemm(GemmKind kind, int config, const GroupedGemmParams& p,
                             cudaStream_t stream);

// Per-TU entry points (one translation unit per GEMM family so they build in parallel).
size_t varlen_m_nn_workspace_bytes(bool f32_out, int config, int num_groups);
std::string run_varlen_m_nn(bool f32_out, int config, const GroupedGemmParams& p,
                            cudaStream_t stream);
size_t varlen_m_nt_f32_workspace_bytes(int config, int num_groups);
std::string run_varlen_m_nt_f32(int config, const GroupedGemmParams& p, cudaStream_t stream);
size_t varlen_m_nt_bf16_workspace_bytes(int config, int num_groups);
std::string run_varlen_m_nt_bf16(int config, const GroupedGemmParams& p, cudaStream_t stream);
size_t varlen_k_workspace_bytes(bool f32_out, int config, int num_groups);
std::string run_varlen_k(bool f32_out, int config, const GroupedGemmParams& p,
                         cudaStream_t stream);
size_t varlen_m_gather_workspace_bytes(bool nt_f32, int config, int num_groups);
std::string run_varlen_m_gather(bool nt_f32, int config, const GroupedGemmParams& p,
                                cudaStream_t stream);
size_t varlen_m_fused_workspace_bytes(bool dswiglu, int config, int num_groups);
// Host checks of every gather instantiation's layout assumptions (accumulator layout of the
// fused epilogues, TMA boxes against the WGMMA stage layout); no GPU needed.
bool varlen_m_gather_layouts_ok();
bool varlen_m_fused_layouts_ok();
bool varlen_m_nn_layouts_ok();       // config 14's TMA boxes (A and B_e by TMA)
bool varlen_m_nt_bf16_layouts_ok();
bool varlen_k_layouts_ok();          // config 14's stage layouts (both operands by TMA)
std::string run_varlen_m_fused(bool dswiglu, int config, const GroupedGemmParams& p,
                               cudaStream_t stream);
// kVarlenKGatherBf16: p.a (a_rows, m), p.b (b_rows, n), p.d (E, m, n); row p of the groups reads
// a[a_idx[p]] (a[p] when a_idx is null) and b[b_idx[p]] likewise.
size_t varlen_k_gather_workspace_bytes(int config, int num_groups);
std::string run_varlen_k_gather(int config, const GroupedGemmParams& p, const int32_t* a_idx,
                                const int32_t* b_idx, int64_t a_rows, int64_t b_rows,
                                cudaStream_t stream);
bool varlen_k_gather_layouts_ok();

// ---- Memory-bound kernels (elementwise.cu). bf16 is passed as raw 16-bit storage. ----

// dst[p, :] = src[idx[p], :] for p < group_offsets[E]; cols % 8 == 0 (16-byte rows chunks).
cudaError_t gather_rows(const uint16_t* src, const int32_t* idx, const int32_t* group_offsets,
                        int num_groups, int64_t capacity, int cols, uint16_t* dst,
                        cudaStream_t stream);

// Top-K plans: dst[reverse_idx[t * top_k + k], :] = src[t, :] for t < num_tokens, k < top_k
// (dst has num_tokens * top_k rows, each written once); cols % 8 == 0.
cudaError_t scatter_rows(const uint16_t* src, const int32_t* reverse_idx, int64_t num_tokens,
                         int top_k, int cols, uint16_t* dst, cudaStream_t stream);

// From the fp32 accumulator acc (P, 2n): h = bf16(acc) (skipped when h == nullptr),
// a = bf16(silu(acc[:, :n]) * acc[:, n:]), rows p < group_offsets[E].
cudaError_t swiglu_fwd(const float* acc, const int32_t* group_offsets, int num_groups,
                       int64_t capacity, int n, uint16_t* h, uint16_t* a, cudaStream_t stream);

// a = bf16(silu(h[:, :n]) * h[:, n:]) from bf16 h (P, 2n), rows p < group_offsets[E]; n % 8 == 0.
cudaError_t swiglu_from_h(const uint16_t* h, const int32_t* group_offsets, int num_groups,
                          int64_t capacity, int n, uint16_t* a, cudaStream_t stream);

// dSwiGLU / dS / A' epilogue: from da (P, n) fp32, h (P, 2n) bf16, s (P,) fp32:
// a = silu(g)·u (fp32 from bf16 h), ds = <da, a>, dh = s·dSwiGLU(da), a_prime = s·a.
// warp_per_row: a warp per row instead of a 256-thread block (same dh and a_prime bits; ds
// summed in another order).
cudaError_t dswiglu(const float* da, const uint16_t* h, const float* s,
                    const int32_t* group_offsets, int num_groups, int64_t capacity, int n,
                    uint16_t* dh, uint16_t* a_prime, float* ds, bool warp_per_row,
                    cudaStream_t stream);

// out[t] = addend[t] + Σ_{j in [token_offsets[t], token_offsets[t+1])} s_j · y[reverse_idx[j]]
// (fp32 acc), scores == nullptr for an unweighted sum, addend == nullptr for none (else
// (num_tokens, cols) bf16). cols % 8 == 0.
cudaError_t combine(const uint16_t* y, const int32_t* token_offsets, const int32_t* reverse_idx,
                    const float* scores, const uint16_t* addend, int num_tokens, int cols,
                    uint16_t* out, cudaStream_t stream);

}  // namespace sonic
