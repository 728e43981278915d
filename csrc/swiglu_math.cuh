// SwiGLU arithmetic shared by the elementwise kernels (elementwise.cu) and the fused GEMM
// epilogues (gather_gemm.cuh), so that both compute the same bits from the same inputs.
#pragma once

#include <cstdint>

namespace sonic {

// Two bf16 values packed in a 32-bit word (the lower half first) as floats.
__device__ __forceinline__ void unpack_bf16x2(uint32_t w, float* f) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// A = silu(g)·u.
__device__ __forceinline__ float swiglu_elem(float g, float u) { return g * sigmoid(g) * u; }

// The backward of one (g, u) pair for dA' = d and score sp: dH's gate and up entries, A' = sp·A,
// and A itself (for dS = Σ d·A).
struct DSwiglu {
  float dg, du, a_prime, act;
};

__device__ __forceinline__ DSwiglu dswiglu_elem(float g, float u, float d, float sp) {
  const float sig = sigmoid(g);
  const float silu = g * sig;
  const float act = silu * u;
  return {sp * d * u * sig * (1.0f + g * (1.0f - sig)), sp * d * silu, sp * act, act};
}

// dswiglu_elem over N consecutive elements (gate g, up u, dA' d); returns Σ d·A, summed in
// order (the elements' part of dS).
template <int N>
__device__ __forceinline__ float dswiglu_n(const float* g, const float* u, const float* d,
                                           float sp, float* dg, float* du, float* a_prime) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const DSwiglu r = dswiglu_elem(g[i], u[i], d[i], sp);
    dot += d[i] * r.act;
    dg[i] = r.dg;
    du[i] = r.du;
    a_prime[i] = r.a_prime;
  }
  return dot;
}

}  // namespace sonic
