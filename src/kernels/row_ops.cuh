// Device helpers the row kernels share (layernorm_modulate.cu, residual_layernorm.cu): loads
// and stores of V consecutive values (V = 1, or 4 as one 16-byte fp32 / 8-byte bf16 vector,
// which the caller has checked is aligned), and sums over the threads of one row. CUDA only,
// no torch headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace vidit {
namespace rowops {

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);  // bf16 is the top half of an fp32: exact
}

// V consecutive fp32 values.
template <int V>
__device__ __forceinline__ void load_f32(const float* __restrict__ p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = p[0];
  } else {
    static_assert(V == 4, "vector width is 1 or 4");
    const float4 q = *reinterpret_cast<const float4*>(p);
    out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
  }
}

// V consecutive bf16 values, as fp32.
template <int V>
__device__ __forceinline__ void load_f32(const __nv_bfloat16* __restrict__ p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = __bfloat162float(p[0]);
  } else {
    static_assert(V == 4, "vector width is 1 or 4");
    const uint2 q = *reinterpret_cast<const uint2*>(p);  // 4 bf16, little endian
    out[0] = bf16_bits_to_float(q.x & 0xffffu);
    out[1] = bf16_bits_to_float(q.x >> 16);
    out[2] = bf16_bits_to_float(q.y & 0xffffu);
    out[3] = bf16_bits_to_float(q.y >> 16);
  }
}

template <int V>
__device__ __forceinline__ void store_f32(float* __restrict__ p, const float (&v)[V]) {
  if constexpr (V == 1) {
    p[0] = v[0];
  } else {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the kTPR threads of one row (threadIdx.x in [0, kTPR)); every thread gets the total.
// For kTPR > 32 the block holds exactly one row and `red` has kTPR / 32 floats.
template <int kTPR>
__device__ __forceinline__ float row_sum(float v, float* red) {
  v = warp_sum(v);
  if constexpr (kTPR > 32) {
    constexpr int kWarps = kTPR / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // every reader of the previous reduction is done with `red`
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < kWarps ? red[lane] : 0.f;
    v = warp_sum(v);
  }
  return v;
}

// Mean and rstd = 1 / sqrt(biased variance + eps) of a row held in registers: this thread holds
// chunk i at columns (i * kTPR + threadIdx.x) * V, zeros past D. Two exact passes (no Welford
// drift); every thread of the row gets both.
template <int kTPR, int kIters, int V>
__device__ __forceinline__ float2 row_mean_rstd(const float (&v)[kIters][V], int D, float eps, float* red) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int j = 0; j < V; ++j) sum += v[i][j];
  const float inv_d = 1.f / float(D);
  const float mean = row_sum<kTPR>(sum, red) * inv_d;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    if ((i * kTPR + int(threadIdx.x)) * V < D) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = v[i][j] - mean;
        sq += d * d;
      }
    }
  }
  return make_float2(mean, rsqrtf(row_sum<kTPR>(sq, red) * inv_d + eps));
}

// Rows per block: 4 warps of one row each for kTPR = 32, else one row per block.
template <int kTPR>
__host__ __device__ constexpr int rows_per_block() {
  return kTPR >= 128 ? 1 : 128 / kTPR;
}

}  // namespace rowops
}  // namespace vidit
