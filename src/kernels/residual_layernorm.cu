// Fused gated residual + LayerNorm + adaLN modulation, forward:
//   r[b, l, :]   = x[b, l, :] + y[b, l, :] * gate[b, 0, :]
//   out[b, l, :] = ((r - mean) * rstd * weight + bias) * (1 + scale[b, 0, :]) + shift[b, 0, :]
// Same layout as layernorm_modulate.cu: one group of kTPR threads per row (a warp for small D,
// a block of 128 / 512 threads for larger D), the row of r held in registers (kIters x V floats
// per thread), so x and y are read once and r and out written once: 8 bytes per element read
// (6 with bf16 y) and 8 written, against about 28 moved by ATen's addcmul, layer_norm and
// addcmul (each pass reads its input and writes a new [B, L, D] fp32 tensor). Mean and
// variance are two exact passes over the registers. Loads and stores are 16-byte vectors
// (V = 4) when D % 4 == 0 and every pointer is aligned. Rows longer than 512 * 8 * V fall back
// to a block-per-row kernel that writes r first and re-reads it (from L1/L2) for the other passes.
// Absent operands (gate, weight, bias, shift, scale) are null pointers, tested once per chunk;
// the test is uniform across the row, so it costs no divergence.
//
// No torch headers here: the launcher (residual_layernorm_launch.h) takes raw pointers, so this
// file compiles with `nvcc -std=c++17 -c` alone. Backward lives in residual_layernorm_cuda.cpp.
#include "kernels/residual_layernorm_launch.h"
#include "kernels/row_ops.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vidit {
namespace {

constexpr int kMaxIters = 8;  // register-cached chunks per thread (x V elements each)
constexpr int kFallbackThreads = 512;

using namespace rowops;

// An optional operand: base[off, off + V), or `fill` everywhere when base is null.
template <int V>
__device__ __forceinline__ void load_or(const float* base, int64_t off, float fill,
                                        float (&out)[V]) {
  if (base) {
    load_f32<V>(base + off, out);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = fill;
  }
}

// r = x + y * gate for V columns starting at `col` of row `row` (batch b).
template <typename T, int V>
__device__ __forceinline__ void residual_chunk(const float* x, const T* y, const float* gate,
                                               int64_t row, int64_t b, int D, int col,
                                               float (&r)[V]) {
  float yv[V], g[V];
  load_f32<V>(x + row * D + col, r);
  load_f32<V>(y + row * D + col, yv);
  load_or<V>(gate, b * D + col, 1.f, g);
#pragma unroll
  for (int j = 0; j < V; ++j) r[j] = fmaf(yv[j], g[j], r[j]);  // exact x + y when gate = 1
}

// out = ((r - mean) * rstd * w + bias) * (1 + scale) + shift for V columns at `col`.
template <int V>
__device__ __forceinline__ void modulate_chunk(const float (&r)[V], float mean, float rstd,
                                               const float* weight, const float* bias,
                                               const float* shift, const float* scale,
                                               int64_t b, int D, int col, float (&o)[V]) {
  float w[V], bi[V], sh[V], sc[V];
  load_or<V>(weight, col, 1.f, w);
  load_or<V>(bias, col, 0.f, bi);
  load_or<V>(shift, b * D + col, 0.f, sh);
  load_or<V>(scale, b * D + col, 0.f, sc);
#pragma unroll
  for (int j = 0; j < V; ++j) o[j] = ((r[j] - mean) * rstd * w[j] + bi[j]) * (1.f + sc[j]) + sh[j];
}

// Register-cached kernel: D <= kTPR * kIters * V. blockDim = (kTPR, rows_per_block<kTPR>()).
template <typename T, int V, int kIters, int kTPR>
__global__ void __launch_bounds__(kTPR * rows_per_block<kTPR>())
    res_ln_reg_kernel(const float* __restrict__ x, const T* __restrict__ y,
                      const float* __restrict__ gate, const float* __restrict__ weight,
                      const float* __restrict__ bias, const float* __restrict__ shift,
                      const float* __restrict__ scale, float* __restrict__ r,
                      float* __restrict__ out, float* __restrict__ mean_out,
                      float* __restrict__ rstd_out, int64_t rows, int64_t L, int D, float eps) {
  __shared__ float red[kTPR > 32 ? kTPR / 32 : 1];
  const int64_t row = int64_t(blockIdx.x) * rows_per_block<kTPR>() + threadIdx.y;
  if (row >= rows) return;  // uniform per row group (a warp, or the whole one-row block)
  const int t = threadIdx.x;
  const int64_t b = row / L;

  float v[kIters][V];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int col = (i * kTPR + t) * V;
    if (col < D) {
      residual_chunk<T, V>(x, y, gate, row, b, D, col, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[i][j] = 0.f;
    }
  }
  const float2 stats = row_mean_rstd<kTPR, kIters, V>(v, D, eps, red);
  const float mean = stats.x, rstd = stats.y;

#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int col = (i * kTPR + t) * V;
    if (col < D) {
      float o[V];
      modulate_chunk<V>(v[i], mean, rstd, weight, bias, shift, scale, b, D, col, o);
      store_f32<V>(r + row * D + col, v[i]);
      store_f32<V>(out + row * D + col, o);
    }
  }
  if (t == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

// Any D: one block of kFallbackThreads per row. Pass 1 computes and writes r; passes 2 and 3
// re-read it (each thread only its own columns, so no synchronisation is needed).
template <typename T, int V>
__global__ void __launch_bounds__(kFallbackThreads)
    res_ln_fallback_kernel(const float* __restrict__ x, const T* __restrict__ y,
                           const float* __restrict__ gate, const float* __restrict__ weight,
                           const float* __restrict__ bias, const float* __restrict__ shift,
                           const float* __restrict__ scale, float* __restrict__ r,
                           float* __restrict__ out, float* __restrict__ mean_out,
                           float* __restrict__ rstd_out, int64_t L, int D, float eps) {
  __shared__ float red[kFallbackThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t b = row / L;
  const int stride = kFallbackThreads * V;

  float sum = 0.f;
  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V];
    residual_chunk<T, V>(x, y, gate, row, b, D, col, v);
    store_f32<V>(r + row * D + col, v);
#pragma unroll
    for (int j = 0; j < V; ++j) sum += v[j];
  }
  const float inv_d = 1.f / float(D);
  const float mean = row_sum<kFallbackThreads>(sum, red) * inv_d;

  float sq = 0.f;
  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V];
    load_f32<V>(r + row * D + col, v);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v[j] - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(row_sum<kFallbackThreads>(sq, red) * inv_d + eps);

  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V], o[V];
    load_f32<V>(r + row * D + col, v);
    modulate_chunk<V>(v, mean, rstd, weight, bias, shift, scale, b, D, col, o);
    store_f32<V>(out + row * D + col, o);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

struct Args {
  const float* x;
  const void* y;
  const float *gate, *weight, *bias, *shift, *scale;
  float *r, *out, *mean, *rstd;
  int64_t rows, L;
  int D;
  float eps;
  cudaStream_t stream;
};

void check_grid(int64_t blocks, int64_t rows) {
  if (blocks > INT_MAX)
    throw std::invalid_argument("launch_residual_layernorm: too many rows (" +
                                std::to_string(rows) + ") for one launch");
}

template <typename T, int V, int kIters, int kTPR>
void launch_reg(const Args& a) {
  constexpr int kRows = rows_per_block<kTPR>();
  const int64_t blocks = (a.rows + kRows - 1) / kRows;
  check_grid(blocks, a.rows);
  res_ln_reg_kernel<T, V, kIters, kTPR><<<unsigned(blocks), dim3(kTPR, kRows), 0, a.stream>>>(
      a.x, static_cast<const T*>(a.y), a.gate, a.weight, a.bias, a.shift, a.scale, a.r, a.out,
      a.mean, a.rstd, a.rows, a.L, a.D, a.eps);
}

// Picks kIters in {1, 2, 4, 8}: the smallest with D <= kTPR * kIters * V.
template <typename T, int V, int kTPR>
void launch_reg_iters(const Args& a) {
  const int64_t per_iter = int64_t(kTPR) * V;
  const int64_t need = (a.D + per_iter - 1) / per_iter;
  if (need <= 1) return launch_reg<T, V, 1, kTPR>(a);
  if (need <= 2) return launch_reg<T, V, 2, kTPR>(a);
  if (need <= 4) return launch_reg<T, V, 4, kTPR>(a);
  return launch_reg<T, V, 8, kTPR>(a);
}

template <typename T, int V>
void launch_typed(const Args& a) {
  const int64_t D = a.D;
  if (D <= int64_t(32) * V * kMaxIters) return launch_reg_iters<T, V, 32>(a);
  if (D <= int64_t(128) * V * kMaxIters) return launch_reg_iters<T, V, 128>(a);
  if (D <= int64_t(512) * V * kMaxIters) return launch_reg_iters<T, V, 512>(a);
  check_grid(a.rows, a.rows);
  res_ln_fallback_kernel<T, V><<<unsigned(a.rows), kFallbackThreads, 0, a.stream>>>(
      a.x, static_cast<const T*>(a.y), a.gate, a.weight, a.bias, a.shift, a.scale, a.r, a.out,
      a.mean, a.rstd, a.L, a.D, a.eps);
}

bool aligned(const void* p, uintptr_t bytes) {  // null (an absent operand) counts as aligned
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

void launch_residual_layernorm(const float* x, const void* y, bool y_is_bf16, const float* gate,
                               const float* weight, const float* bias, const float* shift,
                               const float* scale, float* r, float* out, float* mean, float* rstd,
                               int64_t B, int64_t L, int64_t D, double eps, cudaStream_t stream) {
  if (B < 0 || L < 0 || D <= 0 || D > INT_MAX / 2)
    throw std::invalid_argument("launch_residual_layernorm: bad sizes B=" + std::to_string(B) +
                                " L=" + std::to_string(L) + " D=" + std::to_string(D) +
                                " (need B, L >= 0 and 0 < D <= 2^30)");
  if (!(eps >= 0))
    throw std::invalid_argument("launch_residual_layernorm: eps must be >= 0, got " +
                                std::to_string(eps));
  const int64_t rows = B * L;
  if (rows == 0) return;
  if (!x || !y || !r || !out)
    throw std::invalid_argument("launch_residual_layernorm: x, y, r and out must be non-null");

  const Args a{x, y, gate, weight, bias, shift, scale, r, out, mean, rstd,
               rows, L, int(D), float(eps), stream};
  bool vec = D % 4 == 0 && aligned(y, y_is_bf16 ? 8 : 16);
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(gate),
                        static_cast<const void*>(weight), static_cast<const void*>(bias),
                        static_cast<const void*>(shift), static_cast<const void*>(scale),
                        static_cast<const void*>(r), static_cast<const void*>(out)})
    vec = vec && aligned(p, 16);
  if (y_is_bf16) {
    if (vec) launch_typed<__nv_bfloat16, 4>(a);
    else launch_typed<__nv_bfloat16, 1>(a);
  } else {
    if (vec) launch_typed<float, 4>(a);
    else launch_typed<float, 1>(a);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("launch_residual_layernorm: kernel launch failed (B=") +
                             std::to_string(B) + " L=" + std::to_string(L) +
                             " D=" + std::to_string(D) + (y_is_bf16 ? " bf16 y" : " fp32 y") +
                             "): " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace vidit
