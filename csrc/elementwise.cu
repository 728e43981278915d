// Memory-bound kernels of the ffi backend: row gather / scatter, SwiGLU / dSwiGLU epilogues,
// combine.
// Every kernel reads the number of live rows (group_offsets[E]) on the device, so no host sync;
// rows past it are neither read nor written. Rows move as 16-byte vectors (8 bf16).
#include <cuda_bf16.h>

#include "sonic_ffi.h"
#include "swiglu_math.cuh"

namespace sonic {
namespace ew {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf16_to_f32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
  __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<uint16_t*>(&b);
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) unpack_bf16x2(w[i], f + 2 * i);
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = static_cast<uint32_t>(f32_to_bf16(f[2 * i])) |
           (static_cast<uint32_t>(f32_to_bf16(f[2 * i + 1])) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d) {
  return make_uint2(
      static_cast<uint32_t>(f32_to_bf16(a)) | (static_cast<uint32_t>(f32_to_bf16(b)) << 16),
      static_cast<uint32_t>(f32_to_bf16(c)) | (static_cast<uint32_t>(f32_to_bf16(d)) << 16));
}


int grid_for(int64_t work, int per_block) {
  int64_t blocks = (work + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  return static_cast<int>(blocks < 65535 * 4 ? blocks : 65535 * 4);
}

__global__ void gather_rows_kernel(const uint4* src, const int32_t* idx, const int32_t* offsets,
                                   int num_groups, int chunks, uint4* dst) {
  const int64_t total = offsets[num_groups];
  for (int64_t row = blockIdx.x; row < total; row += gridDim.x) {
    const uint4* s = src + int64_t(idx[row]) * chunks;
    uint4* d = dst + row * chunks;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) d[c] = s[c];
  }
}

// Top-K plans: token t's row is read once and written to its K grouped rows rev[t*K + k]
// (every grouped row is one pair's: P = T*K, all live).
__global__ void scatter_rows_kernel(const uint4* src, const int32_t* rev, int64_t num_tokens,
                                    int top_k, int chunks, uint4* dst) {
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const uint4* s = src + t * chunks;
    const int32_t* r = rev + t * top_k;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 v = s[c];
      for (int j = 0; j < top_k; ++j) dst[int64_t(r[j]) * chunks + c] = v;
    }
  }
}

// One thread per 4 columns of one row: reads gate and up float4s, writes H (both halves) and A.
__global__ void swiglu_fwd_kernel(const float4* acc, const int32_t* offsets, int num_groups,
                                  int n4, uint2* h, uint2* a) {
  const int64_t total = offsets[num_groups] * int64_t(n4);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / n4, col = i % n4;
    const float4 g = acc[row * 2 * n4 + col];
    const float4 u = acc[row * 2 * n4 + n4 + col];
    if (h != nullptr) {
      h[row * 2 * n4 + col] = pack4(g.x, g.y, g.z, g.w);
      h[row * 2 * n4 + n4 + col] = pack4(u.x, u.y, u.z, u.w);
    }
    a[i] = pack4(swiglu_elem(g.x, u.x), swiglu_elem(g.y, u.y), swiglu_elem(g.z, u.z),
                 swiglu_elem(g.w, u.w));
  }
}

// One thread per 8 columns of one row: 16-byte loads of the gate and up halves of bf16 H.
// A from the bf16-rounded H is what the backward recomputes, so forward and backward agree.
__global__ void swiglu_from_h_kernel(const uint4* h, const int32_t* offsets, int num_groups,
                                     int n8, uint4* a) {
  const int64_t total = offsets[num_groups] * int64_t(n8);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / n8, col = i % n8;
    float g[8], u[8], out[8];
    unpack8(h[row * 2 * n8 + col], g);
    unpack8(h[row * 2 * n8 + n8 + col], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = swiglu_elem(g[j], u[j]);
    a[i] = pack8(out);
  }
}

// dSwiGLU of one 4-column chunk c of row `row`; returns the chunk's part of dS.
__device__ __forceinline__ float dswiglu_chunk(const float4* da, const uint2* h, float sp,
                                               int64_t row, int n4, int c, uint2* dh,
                                               uint2* a_prime) {
  const float4 d4 = da[row * n4 + c];
  const uint2 gv = h[row * 2 * n4 + c], uv = h[row * 2 * n4 + n4 + c];
  float g[4], u[4];
  unpack_bf16x2(gv.x, g);
  unpack_bf16x2(gv.y, g + 2);
  unpack_bf16x2(uv.x, u);
  unpack_bf16x2(uv.y, u + 2);
  const float d[4] = {d4.x, d4.y, d4.z, d4.w};
  float dg[4], du[4], ap[4];
  const float dot = dswiglu_n<4>(g, u, d, sp, dg, du, ap);
  dh[row * 2 * n4 + c] = pack4(dg[0], dg[1], dg[2], dg[3]);
  dh[row * 2 * n4 + n4 + c] = pack4(du[0], du[1], du[2], du[3]);
  a_prime[row * n4 + c] = pack4(ap[0], ap[1], ap[2], ap[3]);
  return dot;
}

// One block per row (grid-stride): elementwise dSwiGLU and a block reduction for dS.
__global__ void dswiglu_kernel(const float4* da, const uint2* h, const float* s,
                               const int32_t* offsets, int num_groups, int n4, uint2* dh,
                               uint2* a_prime, float* ds) {
  __shared__ float partial[kThreads / 32];
  const int64_t total = offsets[num_groups];
  for (int64_t row = blockIdx.x; row < total; row += gridDim.x) {
    const float sp = s[row];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
      dot += dswiglu_chunk(da, h, sp, row, n4, c, dh, a_prime);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = dot;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int w = 0; w < blockDim.x / 32; ++w) sum += partial[w];
      ds[row] = sum;
    }
    __syncthreads();
  }
}

// The same with one warp per row (grid-stride over rows), lanes over the chunks, dS reduced by
// warp shuffles. The block version leaves 3/4 of its 256 threads idle at n = 256 (64 chunks) and
// synchronizes the block twice per row: 0.81 ms at T=40960, n=256, K=8 on the H200, about 3x the
// time of its bytes (session 16). This one: 0.32 ms there, 0.51 against 1.30 at T=32768, n=256,
// K=16 (H200, session 20); the ffi backend's default (ops.dswiglu(warp_per_row=True)).
__global__ void dswiglu_warp_kernel(const float4* da, const uint2* h, const float* s,
                                    const int32_t* offsets, int num_groups, int n4, uint2* dh,
                                    uint2* a_prime, float* ds) {
  const int64_t total = offsets[num_groups];
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  // `row` is the same for the 32 lanes of a warp, so every lane reaches the shuffles below.
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; row < total;
       row += warps) {
    const float sp = s[row];
    float dot = 0.0f;
    for (int c = lane; c < n4; c += 32) dot += dswiglu_chunk(da, h, sp, row, n4, c, dh, a_prime);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) ds[row] = dot;
  }
}

// One block per token (grid-stride), threads over 16-byte column chunks, fp32 accumulation
// (starting from the addend's row when there is one).
__global__ void combine_kernel(const uint4* y, const int32_t* token_offsets,
                               const int32_t* reverse_idx, const float* scores,
                               const uint4* addend, int num_tokens, int chunks, uint4* out) {
  for (int t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int begin = token_offsets[t], end = token_offsets[t + 1];
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (addend != nullptr) unpack8(addend[int64_t(t) * chunks + c], acc);
      for (int j = begin; j < end; ++j) {
        const float w = scores != nullptr ? scores[j] : 1.0f;
        float v[8];
        unpack8(y[int64_t(reverse_idx[j]) * chunks + c], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += w * v[i];
      }
      out[int64_t(t) * chunks + c] = pack8(acc);
    }
  }
}

int block_for(int chunks) {
  int b = ((chunks + 31) / 32) * 32;
  return b < kThreads ? (b < 32 ? 32 : b) : kThreads;
}

}  // namespace ew

cudaError_t gather_rows(const uint16_t* src, const int32_t* idx, const int32_t* group_offsets,
                        int num_groups, int64_t capacity, int cols, uint16_t* dst,
                        cudaStream_t stream) {
  if (capacity == 0) return cudaSuccess;
  const int chunks = cols / 8;
  ew::gather_rows_kernel<<<ew::grid_for(capacity, 1), ew::block_for(chunks), 0, stream>>>(
      reinterpret_cast<const uint4*>(src), idx, group_offsets, num_groups, chunks,
      reinterpret_cast<uint4*>(dst));
  return cudaGetLastError();
}

cudaError_t scatter_rows(const uint16_t* src, const int32_t* reverse_idx, int64_t num_tokens,
                         int top_k, int cols, uint16_t* dst, cudaStream_t stream) {
  if (num_tokens == 0 || top_k == 0) return cudaSuccess;
  const int chunks = cols / 8;
  ew::scatter_rows_kernel<<<ew::grid_for(num_tokens, 1), ew::block_for(chunks), 0, stream>>>(
      reinterpret_cast<const uint4*>(src), reverse_idx, num_tokens, top_k, chunks,
      reinterpret_cast<uint4*>(dst));
  return cudaGetLastError();
}

cudaError_t swiglu_fwd(const float* acc, const int32_t* group_offsets, int num_groups,
                       int64_t capacity, int n, uint16_t* h, uint16_t* a, cudaStream_t stream) {
  if (capacity == 0) return cudaSuccess;
  const int n4 = n / 4;
  ew::swiglu_fwd_kernel<<<ew::grid_for(capacity * n4, ew::kThreads), ew::kThreads, 0, stream>>>(
      reinterpret_cast<const float4*>(acc), group_offsets, num_groups, n4,
      reinterpret_cast<uint2*>(h), reinterpret_cast<uint2*>(a));
  return cudaGetLastError();
}

cudaError_t swiglu_from_h(const uint16_t* h, const int32_t* group_offsets, int num_groups,
                          int64_t capacity, int n, uint16_t* a, cudaStream_t stream) {
  if (capacity == 0) return cudaSuccess;
  const int n8 = n / 8;
  ew::swiglu_from_h_kernel<<<ew::grid_for(capacity * n8, ew::kThreads), ew::kThreads, 0,
                             stream>>>(reinterpret_cast<const uint4*>(h), group_offsets,
                                       num_groups, n8, reinterpret_cast<uint4*>(a));
  return cudaGetLastError();
}

cudaError_t dswiglu(const float* da, const uint16_t* h, const float* s,
                    const int32_t* group_offsets, int num_groups, int64_t capacity, int n,
                    uint16_t* dh, uint16_t* a_prime, float* ds, bool warp_per_row,
                    cudaStream_t stream) {
  if (capacity == 0) return cudaSuccess;
  const int n4 = n / 4;
  auto* kernel = warp_per_row ? ew::dswiglu_warp_kernel : ew::dswiglu_kernel;
  const int rows_per_block = warp_per_row ? ew::kThreads / 32 : 1;
  kernel<<<ew::grid_for(capacity, rows_per_block), ew::kThreads, 0, stream>>>(
      reinterpret_cast<const float4*>(da), reinterpret_cast<const uint2*>(h), s, group_offsets,
      num_groups, n4, reinterpret_cast<uint2*>(dh), reinterpret_cast<uint2*>(a_prime), ds);
  return cudaGetLastError();
}

cudaError_t combine(const uint16_t* y, const int32_t* token_offsets, const int32_t* reverse_idx,
                    const float* scores, const uint16_t* addend, int num_tokens, int cols,
                    uint16_t* out, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int chunks = cols / 8;
  ew::combine_kernel<<<ew::grid_for(num_tokens, 1), ew::block_for(chunks), 0, stream>>>(
      reinterpret_cast<const uint4*>(y), token_offsets, reverse_idx, scores,
      reinterpret_cast<const uint4*>(addend), num_tokens, chunks, reinterpret_cast<uint4*>(out));
  return cudaGetLastError();
}

}  // namespace sonic
