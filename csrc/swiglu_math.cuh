// SwiGLU arithmetic shared by the elementwise kernels (elementwise.cu) and the fused GEMM
// epilogues (gather_gemm.cuh), so that both compute the same bits from the same inputs.
#pragma once

namespace sonic {

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

}  // namespace sonic
