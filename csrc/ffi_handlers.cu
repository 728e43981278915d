// XLA FFI handlers of the ffi backend (targets registered from sonic_jax/ffi/_lib.py).
// Shapes are checked here too: a bad call returns an FFI error instead of touching memory.
#include <atomic>
#include <string>

#include "sonic_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace sonic {

size_t grouped_gemm_workspace_bytes(GemmKind kind, int config, int num_groups) {
  switch (kind) {
    case GemmKind::kVarlenMNNF32: return varlen_m_nn_workspace_bytes(true, config, num_groups);
    case GemmKind::kVarlenMNNBf16: return varlen_m_nn_workspace_bytes(false, config, num_groups);
    case GemmKind::kVarlenMNTF32: return varlen_m_nt_f32_workspace_bytes(config, num_groups);
    case GemmKind::kVarlenMNTBf16: return varlen_m_nt_bf16_workspace_bytes(config, num_groups);
    case GemmKind::kVarlenKF32: return varlen_k_workspace_bytes(true, config, num_groups);
    case GemmKind::kVarlenKBf16: return varlen_k_workspace_bytes(false, config, num_groups);
    case GemmKind::kVarlenMGatherNNBf16:
      return varlen_m_gather_workspace_bytes(false, config, num_groups);
    case GemmKind::kVarlenMGatherNTF32:
      return varlen_m_gather_workspace_bytes(true, config, num_groups);
    case GemmKind::kVarlenMGatherSwiGLU:
      return varlen_m_fused_workspace_bytes(false, config, num_groups);
    case GemmKind::kVarlenMGatherDSwiGLU:
      return varlen_m_fused_workspace_bytes(true, config, num_groups);
    case GemmKind::kVarlenKGatherBf16: return varlen_k_gather_workspace_bytes(config, num_groups);
    default: return 0;
  }
}

std::string run_grouped_gemm(GemmKind kind, int config, const GroupedGemmParams& p,
                             cudaStream_t stream) {
  switch (kind) {
    case GemmKind::kVarlenMNNF32: return run_varlen_m_nn(true, config, p, stream);
    case GemmKind::kVarlenMNNBf16: return run_varlen_m_nn(false, config, p, stream);
    case GemmKind::kVarlenMNTF32: return run_varlen_m_nt_f32(config, p, stream);
    case GemmKind::kVarlenMNTBf16: return run_varlen_m_nt_bf16(config, p, stream);
    case GemmKind::kVarlenKF32: return run_varlen_k(true, config, p, stream);
    case GemmKind::kVarlenKBf16: return run_varlen_k(false, config, p, stream);
    case GemmKind::kVarlenMGatherNNBf16: return run_varlen_m_gather(false, config, p, stream);
    case GemmKind::kVarlenMGatherNTF32: return run_varlen_m_gather(true, config, p, stream);
    case GemmKind::kVarlenMGatherSwiGLU: return run_varlen_m_fused(false, config, p, stream);
    case GemmKind::kVarlenMGatherDSwiGLU: return run_varlen_m_fused(true, config, p, stream);
    case GemmKind::kVarlenKGatherBf16:
      return run_varlen_k_gather(config, p, p.gather_idx, nullptr, p.src_rows, 0, stream);
    default: return "unknown GEMM kind " + std::to_string(static_cast<int>(kind));
  }
}

namespace handlers {

// Host invocations of the handlers, and those made while the stream was being captured into a
// CUDA graph (XLA command buffers trace FFI calls by stream capture): lets a test prove capture.
std::atomic<int64_t> g_calls{0}, g_captured_calls{0};

void note_call(cudaStream_t stream) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status == cudaStreamCaptureStatusActive) {
    g_captured_calls.fetch_add(1, std::memory_order_relaxed);
  }
}

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

ffi::Error cuda_error(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

ffi::Error check(bool ok, const std::string& msg) {
  return ok ? ffi::Error::Success() : ffi::Error::InvalidArgument(msg);
}

// src (T, d) bf16, idx (P,) s32, group_offsets (E+1,) s32 -> dst (P, d) bf16.
ffi::Error GatherRowsImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> src,
                          ffi::Buffer<ffi::S32, 1> idx, ffi::Buffer<ffi::S32, 1> offsets,
                          ffi::ResultBuffer<ffi::BF16, 2> dst) {
  note_call(stream);
  const int64_t cols = src.dimensions()[1], cap = idx.dimensions()[0];
  if (auto e = check(cols % 8 == 0 && dst->dimensions()[1] == cols &&
                         dst->dimensions()[0] == cap,
                     "gather_rows: need cols % 8 == 0 and dst (P, cols)");
      e.failure()) return e;
  return cuda_error("gather_rows",
                    gather_rows(src.typed_data(), idx.typed_data(), offsets.typed_data(),
                                static_cast<int>(offsets.dimensions()[0] - 1), cap,
                                static_cast<int>(cols), dst->typed_data(), stream));
}

// src (T, d) bf16, reverse_idx (T*K,) s32 -> dst (T*K, d) bf16: dst[reverse_idx[t*K + k]] = src[t].
ffi::Error ScatterRowsImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> src,
                           ffi::Buffer<ffi::S32, 1> rev, ffi::ResultBuffer<ffi::BF16, 2> dst) {
  note_call(stream);
  const int64_t tokens = src.dimensions()[0], cols = src.dimensions()[1];
  const int64_t pairs = rev.dimensions()[0];
  if (auto e = check(cols % 8 == 0 && tokens > 0 && pairs % tokens == 0 &&
                         dst->dimensions()[0] == pairs && dst->dimensions()[1] == cols,
                     "scatter_rows: need cols % 8 == 0, reverse_idx (T*K,) and dst (T*K, cols)");
      e.failure()) return e;
  return cuda_error("scatter_rows",
                    scatter_rows(src.typed_data(), rev.typed_data(), tokens,
                                 static_cast<int>(pairs / tokens), static_cast<int>(cols),
                                 dst->typed_data(), stream));
}

// kind: GemmKind, config: GemmConfig. varlen-M: a (P, K), b (E, K, N) [NN] or (E, N, K) [NT], d (P, N).
// varlen-K: a (P, M), b (P, N), d (E, M, N). workspace: u8, size from the workspace query.
ffi::Error GroupedGemmImpl(cudaStream_t stream, int32_t kind, int32_t config,
                           ffi::Buffer<ffi::BF16, 2> a,
                           ffi::AnyBuffer b, ffi::Buffer<ffi::S32, 1> offsets,
                           ffi::Result<ffi::AnyBuffer> d,
                           ffi::ResultBuffer<ffi::U8, 1> workspace) {
  note_call(stream);
  const GemmKind k = static_cast<GemmKind>(kind);
  if (auto e = check(!is_gather_kind(k), "grouped_gemm: GEMM kind " + std::to_string(kind) +
                                             " gathers its A rows; call "
                                             "sonic_jax_gathered_grouped_gemm");
      e.failure()) return e;
  if (auto e = check(k != GemmKind::kVarlenKGatherBf16,
                     "grouped_gemm: GEMM kind 10 reads rows through indices; call "
                     "sonic_jax_gathered_varlen_k");
      e.failure()) return e;
  if (auto e = check(!is_fused_epilogue_kind(k), "grouped_gemm: GEMM kind " +
                                                     std::to_string(kind) +
                                                     " has a fused epilogue; call "
                                                     "sonic_jax_up_proj_swiglu / "
                                                     "sonic_jax_dh_dswiglu");
      e.failure()) return e;
  const int num_groups = static_cast<int>(offsets.dimensions()[0] - 1);
  GroupedGemmParams p{};
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = d->untyped_data();
  p.group_offsets = offsets.typed_data();
  p.num_groups = num_groups;
  p.workspace = workspace->untyped_data();
  p.workspace_bytes = workspace->size_bytes();
  auto ad = a.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  p.src_rows = ad[0];  // rows of a (and of b for varlen-K): config 14's TMA descriptors
  const bool f32_out = k == GemmKind::kVarlenMNNF32 || k == GemmKind::kVarlenMNTF32 ||
                       k == GemmKind::kVarlenKF32;
  std::string shapes = "a " + dims_str(ad) + ", b " + dims_str(bd) + ", d " + dims_str(dd);
  if (auto e = check(b.element_type() == ffi::BF16 &&
                         d->element_type() == (f32_out ? ffi::F32 : ffi::BF16),
                     "grouped_gemm: b must be bf16 and d " + std::string(f32_out ? "f32" : "bf16"));
      e.failure()) return e;
  if (k == GemmKind::kVarlenKF32 || k == GemmKind::kVarlenKBf16) {
    p.m = static_cast<int>(ad[1]);
    p.n = static_cast<int>(bd.size() == 2 ? bd[1] : -1);
    if (auto e = check(bd.size() == 2 && bd[0] == ad[0] && dd.size() == 3 &&
                           dd[0] == num_groups && dd[1] == p.m && dd[2] == p.n &&
                           p.m % 8 == 0 && p.n % 8 == 0,
                       "grouped_gemm varlen-K: bad shapes " + shapes);
        e.failure()) return e;
  } else {
    const bool nt = k == GemmKind::kVarlenMNTF32 || k == GemmKind::kVarlenMNTBf16;
    p.k = static_cast<int>(ad[1]);
    p.n = static_cast<int>(bd.size() == 3 ? (nt ? bd[1] : bd[2]) : -1);
    const int64_t bk = bd.size() == 3 ? (nt ? bd[2] : bd[1]) : -1;
    if (auto e = check(bd.size() == 3 && bd[0] == num_groups && bk == p.k && dd.size() == 2 &&
                           dd[0] == ad[0] && dd[1] == p.n && p.k % 8 == 0 && p.n % 8 == 0,
                       "grouped_gemm varlen-M: bad shapes " + shapes);
        e.failure()) return e;
  }
  std::string err = run_grouped_gemm(k, config, p, stream);
  if (!err.empty()) return ffi::Error::Internal("grouped_gemm: " + err);
  return ffi::Error::Success();
}

// kind: a gather GemmKind, config: GemmConfig. src (T, K) bf16, gather_idx (P,) s32,
// b (E, K, N) [NN] or (E, N, K) [NT] bf16, group_offsets (E+1,) -> d (P, N) (bf16 for NN, f32 for
// NT): d[p] = src[gather_idx[p]] · op(b[e]) for p in group e; rows from group_offsets[E] on are
// not written. workspace: u8, size from the workspace query.
ffi::Error GatheredGroupedGemmImpl(cudaStream_t stream, int32_t kind, int32_t config,
                                   ffi::Buffer<ffi::BF16, 2> src, ffi::Buffer<ffi::S32, 1> idx,
                                   ffi::AnyBuffer b, ffi::Buffer<ffi::S32, 1> offsets,
                                   ffi::Result<ffi::AnyBuffer> d,
                                   ffi::ResultBuffer<ffi::U8, 1> workspace) {
  note_call(stream);
  const GemmKind k = static_cast<GemmKind>(kind);
  if (auto e = check(is_gather_kind(k), "gathered_grouped_gemm: GEMM kind " +
                                            std::to_string(kind) + " is not a gather kind");
      e.failure()) return e;
  const bool nt = k == GemmKind::kVarlenMGatherNTF32;
  auto sd = src.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  const int64_t num_groups = offsets.dimensions()[0] - 1;
  const int64_t cap = idx.dimensions()[0];
  const int64_t n = bd.size() == 3 ? (nt ? bd[1] : bd[2]) : -1;
  const int64_t bk = bd.size() == 3 ? (nt ? bd[2] : bd[1]) : -1;
  std::string shapes = "src " + dims_str(sd) + ", gather_idx " + dims_str(idx.dimensions()) +
                       ", b " + dims_str(bd) + ", d " + dims_str(dd);
  if (auto e = check(b.element_type() == ffi::BF16 &&
                         d->element_type() == (nt ? ffi::F32 : ffi::BF16),
                     "gathered_grouped_gemm: b must be bf16 and d " +
                         std::string(nt ? "f32" : "bf16"));
      e.failure()) return e;
  if (auto e = check(num_groups >= 1 && bd.size() == 3 && bd[0] == num_groups && bk == sd[1] &&
                         dd.size() == 2 && dd[0] == cap && dd[1] == n && sd[1] % 8 == 0 &&
                         n % 8 == 0 && cap < (int64_t(1) << 31),
                     "gathered_grouped_gemm: bad shapes " + shapes +
                         " (need b (E, K, N) or (E, N, K), d (P, N), K and N multiples of 8)");
      e.failure()) return e;
  GroupedGemmParams p{};
  p.a = src.untyped_data();
  p.b = b.untyped_data();
  p.d = d->untyped_data();
  p.group_offsets = offsets.typed_data();
  p.num_groups = static_cast<int>(num_groups);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(sd[1]);
  p.workspace = workspace->untyped_data();
  p.workspace_bytes = workspace->size_bytes();
  p.gather_idx = idx.typed_data();
  p.src_rows = sd[0];
  std::string err = run_grouped_gemm(k, config, p, stream);
  if (!err.empty()) return ffi::Error::Internal("gathered_grouped_gemm: " + err);
  return ffi::Error::Success();
}

// config: GemmConfig (5, 6, 8 or 9). a (Ta, M) bf16, a_idx (P,) or (0,) s32, b (Tb, N) bf16, b_idx (P,) or
// (0,) s32, group_offsets (E+1,) -> d (E, M, N) bf16: d[e] = Σ_{p in group e} a[ia(p)]ᵀ ⊗ b[ib(p)]
// with ia(p) = a_idx[p] (p when a_idx is empty) and ib likewise; workspace u8 (unused).
ffi::Error GatheredVarlenKImpl(cudaStream_t stream, int32_t config, ffi::Buffer<ffi::BF16, 2> a,
                               ffi::Buffer<ffi::S32, 1> a_idx, ffi::Buffer<ffi::BF16, 2> b,
                               ffi::Buffer<ffi::S32, 1> b_idx, ffi::Buffer<ffi::S32, 1> offsets,
                               ffi::ResultBuffer<ffi::BF16, 3> d,
                               ffi::ResultBuffer<ffi::U8, 1> workspace) {
  note_call(stream);
  auto ad = a.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  const int64_t num_groups = offsets.dimensions()[0] - 1;
  const int64_t na = a_idx.dimensions()[0], nb = b_idx.dimensions()[0];
  // Rows of the groups: the index length where there is one, else the operand's rows.
  const int64_t rows_a = na > 0 ? na : ad[0], rows_b = nb > 0 ? nb : bd[0];
  const std::string shapes = "a " + dims_str(ad) + ", a_idx " + dims_str(a_idx.dimensions()) +
                             ", b " + dims_str(bd) + ", b_idx " + dims_str(b_idx.dimensions()) +
                             ", d " + dims_str(dd);
  if (auto e = check(num_groups >= 1 && rows_a == rows_b && rows_a < (int64_t(1) << 31) &&
                         ad[1] % 8 == 0 && bd[1] % 8 == 0 && dd[0] == num_groups &&
                         dd[1] == ad[1] && dd[2] == bd[1],
                     "gathered_varlen_k: bad shapes " + shapes + " (need as many rows through "
                     "a_idx or a as through b_idx or b, d (E, M, N), M and N multiples of 8)");
      e.failure()) return e;
  GroupedGemmParams p{};
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = d->untyped_data();
  p.group_offsets = offsets.typed_data();
  p.num_groups = static_cast<int>(num_groups);
  p.m = static_cast<int>(ad[1]);
  p.n = static_cast<int>(bd[1]);
  p.workspace = workspace->untyped_data();
  p.workspace_bytes = workspace->size_bytes();
  std::string err = run_varlen_k_gather(config, p, na > 0 ? a_idx.typed_data() : nullptr,
                                        nb > 0 ? b_idx.typed_data() : nullptr, ad[0], bd[0],
                                        stream);
  if (!err.empty()) return ffi::Error::Internal("gathered_varlen_k: " + err);
  return ffi::Error::Success();
}

// Shared checks of the fused-epilogue GEMMs: src (T, K) with gather_idx (P,) when `gathered`,
// else (P, K); b (E, ., .) bf16 with the K and n given; P < 2^31; K and n multiples of 8.
ffi::Error check_fused_operands(const char* name, bool gathered, ffi::AnyBuffer::Dimensions sd,
                                ffi::AnyBuffer::Dimensions idx, ffi::AnyBuffer::Dimensions bd,
                                int64_t num_groups, int64_t cap, int64_t k, int64_t n) {
  const std::string shapes = std::string(name) + ": src " + dims_str(sd) + ", gather_idx " +
                             dims_str(idx) + ", b " + dims_str(bd);
  if (auto e = check(num_groups >= 1 && bd[0] == num_groups && sd[1] == k && k % 8 == 0 &&
                         n % 8 == 0 && n > 0 && cap < (int64_t(1) << 31),
                     shapes + ": need b (E, ...) with E = len(group_offsets) - 1, src (., K), "
                              "K and n multiples of 8");
      e.failure()) return e;
  return check(gathered ? idx[0] == cap : sd[0] == cap,
               shapes + (gathered ? ": gather_idx must have one entry per output row"
                                  : ": without a gather, src must have one row per output row"));
}

// The operands both fused-epilogue handlers pass (after check_fused_operands); the caller adds
// its epilogue's buffers.
GroupedGemmParams fused_params(ffi::Buffer<ffi::BF16, 2> src, ffi::Buffer<ffi::S32, 1> idx,
                               const void* b, ffi::Buffer<ffi::S32, 1> offsets, int64_t n,
                               int64_t k, bool gathered, void* workspace,
                               size_t workspace_bytes) {
  GroupedGemmParams p{};
  p.a = src.untyped_data();
  p.b = b;
  p.group_offsets = offsets.typed_data();
  p.num_groups = static_cast<int>(offsets.dimensions()[0] - 1);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  p.gather_idx = gathered ? idx.typed_data() : nullptr;
  p.src_rows = src.dimensions()[0];
  return p;
}

// config: GemmConfig (4 or 5), gathered: 1 = src rows through gather_idx, 0 = src is (P, K).
// src, gather_idx (P,) s32, w1 (E, K, 2n) bf16, group_offsets (E+1,) -> h (P, 2n) bf16 or (0, 2n)
// (not written: inference), a (P, n) bf16, workspace u8.
ffi::Error UpProjSwigluImpl(cudaStream_t stream, int32_t config, int32_t gathered,
                            ffi::Buffer<ffi::BF16, 2> src, ffi::Buffer<ffi::S32, 1> idx,
                            ffi::Buffer<ffi::BF16, 3> w1, ffi::Buffer<ffi::S32, 1> offsets,
                            ffi::ResultBuffer<ffi::BF16, 2> h, ffi::ResultBuffer<ffi::BF16, 2> a,
                            ffi::ResultBuffer<ffi::U8, 1> workspace) {
  note_call(stream);
  auto wd = w1.dimensions(), ad = a->dimensions(), hd = h->dimensions();
  const int64_t cap = ad[0], n = wd[2] / 2, k = wd[1];
  if (auto e = check_fused_operands("up_proj_swiglu", gathered != 0, src.dimensions(),
                                    idx.dimensions(), wd, offsets.dimensions()[0] - 1, cap, k, n);
      e.failure()) return e;
  if (auto e = check(wd[2] % 2 == 0 && ad[1] == n && hd[1] == 2 * n && (hd[0] == cap || hd[0] == 0),
                     "up_proj_swiglu: need w1 (E, K, 2n), a (P, n) and h (P, 2n) or (0, 2n); got "
                     "w1 " + dims_str(wd) + ", a " + dims_str(ad) + ", h " + dims_str(hd));
      e.failure()) return e;
  GroupedGemmParams p = fused_params(src, idx, w1.untyped_data(), offsets, n, k, gathered != 0,
                                     workspace->untyped_data(), workspace->size_bytes());
  p.h_out = hd[0] == 0 ? nullptr : h->untyped_data();
  p.a_out = a->untyped_data();
  std::string err = run_grouped_gemm(GemmKind::kVarlenMGatherSwiGLU, config, p, stream);
  if (!err.empty()) return ffi::Error::Internal("up_proj_swiglu: " + err);
  return ffi::Error::Success();
}

// config: GemmConfig (4 or 5), gathered as above. src dO, gather_idx (P,), w2 (E, n, K) bf16,
// h (P, 2n) bf16, s (P,) f32, group_offsets -> dh (P, 2n) bf16, a' (P, n) bf16,
// ds_part (P, ceil(n / tile N)) f32 (the caller sums its columns), workspace u8.
ffi::Error DhDSwigluImpl(cudaStream_t stream, int32_t config, int32_t gathered,
                         ffi::Buffer<ffi::BF16, 2> src, ffi::Buffer<ffi::S32, 1> idx,
                         ffi::Buffer<ffi::BF16, 3> w2, ffi::Buffer<ffi::BF16, 2> h,
                         ffi::Buffer<ffi::F32, 1> s, ffi::Buffer<ffi::S32, 1> offsets,
                         ffi::ResultBuffer<ffi::BF16, 2> dh,
                         ffi::ResultBuffer<ffi::BF16, 2> a_prime,
                         ffi::ResultBuffer<ffi::F32, 2> ds_part,
                         ffi::ResultBuffer<ffi::U8, 1> workspace) {
  note_call(stream);
  auto wd = w2.dimensions(), hd = h.dimensions(), dd = ds_part->dimensions();
  const int64_t cap = hd[0], n = wd[1], k = wd[2];
  if (auto e = check_fused_operands("dh_dswiglu", gathered != 0, src.dimensions(),
                                    idx.dimensions(), wd, offsets.dimensions()[0] - 1, cap, k, n);
      e.failure()) return e;
  const int tile_n = fused_epilogue_tile_n(GemmKind::kVarlenMGatherDSwiGLU, config);
  if (auto e = check(tile_n > 0, "dh_dswiglu: config " + std::to_string(config) +
                                     " is not instantiated");
      e.failure()) return e;
  if (auto e = check(hd[1] == 2 * n && s.dimensions()[0] == cap &&
                         dh->dimensions()[0] == cap && dh->dimensions()[1] == 2 * n &&
                         a_prime->dimensions()[0] == cap && a_prime->dimensions()[1] == n &&
                         dd[0] == cap && dd[1] == (n + tile_n - 1) / tile_n,
                     "dh_dswiglu: need w2 (E, n, K), h / dh (P, 2n), s (P,), a' (P, n), ds_part "
                     "(P, ceil(n / " + std::to_string(tile_n) + ")); got w2 " + dims_str(wd) +
                         ", h " + dims_str(hd) + ", ds_part " + dims_str(dd));
      e.failure()) return e;
  GroupedGemmParams p = fused_params(src, idx, w2.untyped_data(), offsets, n, k, gathered != 0,
                                     workspace->untyped_data(), workspace->size_bytes());
  p.h_in = h.untyped_data();
  p.scores = s.typed_data();
  p.dh_out = dh->untyped_data();
  p.a_prime_out = a_prime->untyped_data();
  p.ds_part = ds_part->typed_data();
  std::string err = run_grouped_gemm(GemmKind::kVarlenMGatherDSwiGLU, config, p, stream);
  if (!err.empty()) return ffi::Error::Internal("dh_dswiglu: " + err);
  return ffi::Error::Success();
}

// acc (P, 2n) f32, group_offsets -> h (P, 2n) bf16 (kWriteH), a (P, n) bf16.
template <bool kWriteH>
ffi::Error SwigluImpl(cudaStream_t stream, ffi::Buffer<ffi::F32, 2> acc,
                      ffi::Buffer<ffi::S32, 1> offsets, ffi::ResultBuffer<ffi::BF16, 2> first,
                      ffi::ResultBuffer<ffi::BF16, 2> second) {
  note_call(stream);
  const int64_t cap = acc.dimensions()[0], two_n = acc.dimensions()[1];
  uint16_t* h = kWriteH ? first->typed_data() : nullptr;
  uint16_t* a = kWriteH ? second->typed_data() : first->typed_data();
  if (auto e = check(two_n % 8 == 0, "swiglu: 2n must be a multiple of 8"); e.failure()) return e;
  return cuda_error("swiglu", swiglu_fwd(acc.typed_data(), offsets.typed_data(),
                                         static_cast<int>(offsets.dimensions()[0] - 1), cap,
                                         static_cast<int>(two_n / 2), h, a, stream));
}

ffi::Error SwigluHAImpl(cudaStream_t stream, ffi::Buffer<ffi::F32, 2> acc,
                        ffi::Buffer<ffi::S32, 1> offsets, ffi::ResultBuffer<ffi::BF16, 2> h,
                        ffi::ResultBuffer<ffi::BF16, 2> a) {
  return SwigluImpl<true>(stream, acc, offsets, h, a);
}

ffi::Error SwigluAImpl(cudaStream_t stream, ffi::Buffer<ffi::F32, 2> acc,
                       ffi::Buffer<ffi::S32, 1> offsets, ffi::ResultBuffer<ffi::BF16, 2> a) {
  return SwigluImpl<false>(stream, acc, offsets, a, a);
}

// h (P, 2n) bf16, group_offsets -> a = silu(gate)·up (P, n) bf16.
ffi::Error SwigluFromHImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> h,
                           ffi::Buffer<ffi::S32, 1> offsets, ffi::ResultBuffer<ffi::BF16, 2> a) {
  note_call(stream);
  const int64_t cap = h.dimensions()[0], two_n = h.dimensions()[1];
  if (auto e = check(two_n % 16 == 0 && a->dimensions()[0] == cap &&
                         a->dimensions()[1] == two_n / 2,
                     "swiglu_from_h: need h (P, 2n), a (P, n), n % 8 == 0");
      e.failure()) return e;
  return cuda_error("swiglu_from_h",
                    swiglu_from_h(h.typed_data(), offsets.typed_data(),
                                  static_cast<int>(offsets.dimensions()[0] - 1), cap,
                                  static_cast<int>(two_n / 2), a->typed_data(), stream));
}

// da (P, n) f32, h (P, 2n) bf16, s (P,) f32 -> dh (P, 2n) bf16, a' (P, n) bf16, ds (P,) f32.
// warp_per_row: 1 = a warp per row, 0 = a block per row.
ffi::Error DSwigluImpl(cudaStream_t stream, int32_t warp_per_row, ffi::Buffer<ffi::F32, 2> da,
                       ffi::Buffer<ffi::BF16, 2> h, ffi::Buffer<ffi::F32, 1> s,
                       ffi::Buffer<ffi::S32, 1> offsets, ffi::ResultBuffer<ffi::BF16, 2> dh,
                       ffi::ResultBuffer<ffi::BF16, 2> a_prime, ffi::ResultBuffer<ffi::F32, 1> ds) {
  note_call(stream);
  const int64_t cap = da.dimensions()[0], n = da.dimensions()[1];
  if (auto e = check(n % 4 == 0 && h.dimensions()[1] == 2 * n && h.dimensions()[0] == cap &&
                         s.dimensions()[0] == cap,
                     "dswiglu: need da (P, n), h (P, 2n), s (P,), n % 4 == 0");
      e.failure()) return e;
  return cuda_error("dswiglu",
                    dswiglu(da.typed_data(), h.typed_data(), s.typed_data(),
                            offsets.typed_data(), static_cast<int>(offsets.dimensions()[0] - 1),
                            cap, static_cast<int>(n), dh->typed_data(), a_prime->typed_data(),
                            ds->typed_data(), warp_per_row != 0, stream));
}

// The three combine handlers: out[t] = [addend[t] +] Σ_{j in token t} [s_j ·] y[reverse_idx[j]];
// scores and addend may be null.
ffi::Error run_combine(cudaStream_t stream, const char* name, ffi::Buffer<ffi::BF16, 2>& y,
                       ffi::Buffer<ffi::S32, 1>& token_offsets,
                       ffi::Buffer<ffi::S32, 1>& reverse_idx, const float* scores,
                       const ffi::Buffer<ffi::BF16, 2>* addend,
                       ffi::ResultBuffer<ffi::BF16, 2>& out) {
  note_call(stream);
  const int64_t cols = y.dimensions()[1];
  if (auto e = check(cols % 8 == 0, "combine: d must be a multiple of 8"); e.failure()) return e;
  if (addend != nullptr) {
    if (auto e = check(addend->dimensions()[0] == out->dimensions()[0] &&
                           addend->dimensions()[1] == cols,
                       "combine_add: addend must have shape (T, d)");
        e.failure())
      return e;
  }
  return cuda_error(name, combine(y.typed_data(), token_offsets.typed_data(),
                                  reverse_idx.typed_data(), scores,
                                  addend != nullptr ? addend->typed_data() : nullptr,
                                  static_cast<int>(out->dimensions()[0]), static_cast<int>(cols),
                                  out->typed_data(), stream));
}

// y (P, d) bf16, token_offsets (T+1,), reverse_idx (P,), [scores (P,) f32] -> out (T, d) bf16.
ffi::Error CombineWeightedImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> y,
                               ffi::Buffer<ffi::S32, 1> token_offsets,
                               ffi::Buffer<ffi::S32, 1> reverse_idx, ffi::Buffer<ffi::F32, 1> s,
                               ffi::ResultBuffer<ffi::BF16, 2> out) {
  return run_combine(stream, "combine", y, token_offsets, reverse_idx, s.typed_data(), nullptr,
                     out);
}

ffi::Error CombineUnweightedImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> y,
                                 ffi::Buffer<ffi::S32, 1> token_offsets,
                                 ffi::Buffer<ffi::S32, 1> reverse_idx,
                                 ffi::ResultBuffer<ffi::BF16, 2> out) {
  return run_combine(stream, "combine", y, token_offsets, reverse_idx, nullptr, nullptr, out);
}

// The unweighted combine plus addend (T, d) bf16 in its fp32 sum (dx with the router's share).
ffi::Error CombineAddImpl(cudaStream_t stream, ffi::Buffer<ffi::BF16, 2> y,
                          ffi::Buffer<ffi::S32, 1> token_offsets,
                          ffi::Buffer<ffi::S32, 1> reverse_idx, ffi::Buffer<ffi::BF16, 2> addend,
                          ffi::ResultBuffer<ffi::BF16, 2> out) {
  return run_combine(stream, "combine_add", y, token_offsets, reverse_idx, nullptr, &addend,
                     out);
}

}  // namespace handlers
}  // namespace sonic

using sonic::handlers::CombineAddImpl;
using sonic::handlers::CombineUnweightedImpl;
using sonic::handlers::CombineWeightedImpl;
using sonic::handlers::DhDSwigluImpl;
using sonic::handlers::DSwigluImpl;
using sonic::handlers::GatheredGroupedGemmImpl;
using sonic::handlers::GatheredVarlenKImpl;
using sonic::handlers::GatherRowsImpl;
using sonic::handlers::GroupedGemmImpl;
using sonic::handlers::ScatterRowsImpl;
using sonic::handlers::SwigluAImpl;
using sonic::handlers::SwigluFromHImpl;
using sonic::handlers::SwigluHAImpl;
using sonic::handlers::UpProjSwigluImpl;

using Stream = ffi::PlatformStream<cudaStream_t>;
// Every handler only enqueues work on the stream (sizes read on the device, no host sync, host
// set-up depends only on shapes and buffer addresses), so XLA may capture it into a command
// buffer (CUDA graph) and replay it; verified on the H200 (docs/ffi.md).
#define SONIC_CMD_BUFFER \
  { ffi::Traits::kCmdBufferCompatible }
// Aliases: template arguments with commas cannot go through the handler macro.
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using Bf16Tensor3 = ffi::Buffer<ffi::BF16, 3>;
using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using F32Vector = ffi::Buffer<ffi::F32, 1>;
using S32Vector = ffi::Buffer<ffi::S32, 1>;
using U8Vector = ffi::Buffer<ffi::U8, 1>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicGatherRows, GatherRowsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicScatterRows, ScatterRowsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicGroupedGemm, GroupedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("config")
                                  .Arg<Bf16Matrix>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<S32Vector>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<U8Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicGatheredGroupedGemm, GatheredGroupedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("config")
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<S32Vector>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<U8Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicGatheredVarlenK, GatheredVarlenKImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("config")
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Tensor3>()
                                  .Ret<U8Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicUpProjSwiglu, UpProjSwigluImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("config")
                                  .Attr<int32_t>("gathered")
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<Bf16Tensor3>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<U8Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicDhDSwiglu, DhDSwigluImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("config")
                                  .Attr<int32_t>("gathered")
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<Bf16Tensor3>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<F32Vector>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<F32Matrix>()
                                  .Ret<U8Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicSwigluHA, SwigluHAImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<F32Matrix>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicSwigluA, SwigluAImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<F32Matrix>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicSwigluFromH, SwigluFromHImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicDSwiglu, DSwigluImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Attr<int32_t>("warp_per_row")
                                  .Arg<F32Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<F32Vector>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<Bf16Matrix>()
                                  .Ret<F32Vector>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicCombineWeighted, CombineWeightedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<S32Vector>()
                                  .Arg<F32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicCombineUnweighted, CombineUnweightedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<S32Vector>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SonicCombineAdd, CombineAddImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<S32Vector>()
                                  .Arg<S32Vector>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<Bf16Matrix>(),
                              SONIC_CMD_BUFFER);

// Plain C entry points for the Python loader (ctypes).
extern "C" {

__attribute__((visibility("default"))) int sonic_jax_abi_version() { return 15; }

// Workspace bytes the SonicGroupedGemm target needs for `kind`, `config` and `num_groups` on the
// current device (CUTLASS sizes its TMA-descriptor workspace by the SM count); -1 for an unknown
// kind or config, 0 for a (kind, config) pair that is not instantiated.
__attribute__((visibility("default"))) int64_t sonic_jax_gemm_workspace_bytes(int kind, int config,
                                                                              int num_groups) {
  if (kind < 0 || kind >= static_cast<int>(sonic::GemmKind::kNumKinds)) return -1;
  if (config < 0 || config >= static_cast<int>(sonic::GemmConfig::kNumConfigs)) return -1;
  return static_cast<int64_t>(sonic::grouped_gemm_workspace_bytes(
      static_cast<sonic::GemmKind>(kind), config, num_groups));
}

// 1 when every gathered GEMM instantiation's layout assumptions hold (host only, no GPU).
__attribute__((visibility("default"))) int sonic_jax_check_layouts() {
  return sonic::varlen_m_gather_layouts_ok() && sonic::varlen_m_fused_layouts_ok() &&
                 sonic::varlen_k_gather_layouts_ok() && sonic::varlen_m_nn_layouts_ok() &&
                 sonic::varlen_m_nt_bf16_layouts_ok() && sonic::varlen_k_layouts_ok()
             ? 1
             : 0;
}

// Output columns per tile of a fused-epilogue kind's config (dS_part has ceil(n / this)
// columns), 0 when the pair is not instantiated.
__attribute__((visibility("default"))) int sonic_jax_fused_tile_n(int kind, int config) {
  return sonic::fused_epilogue_tile_n(static_cast<sonic::GemmKind>(kind), config);
}

// Handler invocations so far: all of them (captured == 0) or those made during stream capture.
__attribute__((visibility("default"))) int64_t sonic_jax_handler_calls(int captured) {
  return captured ? sonic::handlers::g_captured_calls.load() : sonic::handlers::g_calls.load();
}

}  // extern "C"
