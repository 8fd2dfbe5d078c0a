// Fused LayerNorm (no affine) + adaLN modulation, forward:
//   y[b, l, :] = (x[b, l, :] - mean) * rstd * (1 + scale[b, 0, :]) + shift[b, 0, :]
// One group of kTPR threads per row (a warp for small D, a block of 128 / 512 threads for larger
// D). The row is held in registers (kIters x V floats per thread), so x is read once from global
// memory and y written once; mean and variance are two exact passes over the registers (no
// Welford drift). Loads and stores are 16-byte vectors (V = 4) when D % 4 == 0 and every pointer
// is aligned. Rows longer than 512 * 8 * V fall back to a block-per-row kernel that re-reads
// the row (from L1/L2) instead of caching it.
//
// No torch headers here: the launcher (layernorm_modulate_launch.h) takes raw pointers, so this
// file compiles with `nvcc -std=c++17 -c` alone. Backward lives in layernorm_modulate_cuda.cpp.
#include "kernels/layernorm_modulate_launch.h"
#include "kernels/row_ops.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vidit {
namespace {

constexpr int kMaxIters = 8;        // register-cached chunks per thread (x V elements each)
constexpr int kFallbackThreads = 512;

using namespace rowops;

// Register-cached kernel: D <= kTPR * kIters * V. blockDim = (kTPR, rows_per_block<kTPR>()).
template <typename T, int V, int kIters, int kTPR>
__global__ void __launch_bounds__(kTPR * rows_per_block<kTPR>())
    ln_mod_reg_kernel(const T* __restrict__ x, const float* __restrict__ shift,
                      const float* __restrict__ scale, float* __restrict__ y,
                      float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                      int64_t L, int D, float eps) {
  __shared__ float red[kTPR > 32 ? kTPR / 32 : 1];
  const int64_t row = int64_t(blockIdx.x) * rows_per_block<kTPR>() + threadIdx.y;
  if (row >= rows) return;  // uniform per row group (a warp, or the whole one-row block)
  const int t = threadIdx.x;
  const T* xr = x + row * D;

  float v[kIters][V];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int col = (i * kTPR + t) * V;
    if (col < D) {
      load_f32<V>(xr + col, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[i][j] = 0.f;
    }
  }
  const float2 stats = row_mean_rstd<kTPR, kIters, V>(v, D, eps, red);
  const float mean = stats.x, rstd = stats.y;

  const int64_t b = row / L;
  const float* shr = shift + b * D;
  const float* scr = scale + b * D;
  float* yr = y + row * D;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int col = (i * kTPR + t) * V;
    if (col < D) {
      float sh[V], sc[V], out[V];
      load_f32<V>(shr + col, sh);
      load_f32<V>(scr + col, sc);
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = (v[i][j] - mean) * rstd * (1.f + sc[j]) + sh[j];
      store_f32<V>(yr + col, out);
    }
  }
  if (t == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

// Any D: one block of kFallbackThreads per row, three strided passes over global memory.
template <typename T, int V>
__global__ void __launch_bounds__(kFallbackThreads)
    ln_mod_fallback_kernel(const T* __restrict__ x, const float* __restrict__ shift,
                           const float* __restrict__ scale, float* __restrict__ y,
                           float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t L,
                           int D, float eps) {
  __shared__ float red[kFallbackThreads / 32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const int stride = kFallbackThreads * V;

  float sum = 0.f;
  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V];
    load_f32<V>(xr + col, v);
#pragma unroll
    for (int j = 0; j < V; ++j) sum += v[j];
  }
  const float inv_d = 1.f / float(D);
  const float mean = row_sum<kFallbackThreads>(sum, red) * inv_d;

  float sq = 0.f;
  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V];
    load_f32<V>(xr + col, v);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v[j] - mean;
      sq += d * d;
    }
  }
  const float var = row_sum<kFallbackThreads>(sq, red) * inv_d;
  const float rstd = rsqrtf(var + eps);

  const int64_t b = row / L;
  const float* shr = shift + b * D;
  const float* scr = scale + b * D;
  float* yr = y + row * D;
  for (int col = threadIdx.x * V; col < D; col += stride) {
    float v[V], sh[V], sc[V], out[V];
    load_f32<V>(xr + col, v);
    load_f32<V>(shr + col, sh);
    load_f32<V>(scr + col, sc);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = (v[j] - mean) * rstd * (1.f + sc[j]) + sh[j];
    store_f32<V>(yr + col, out);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

struct Args {
  const void* x;
  const float* shift;
  const float* scale;
  float* y;
  float* mean;
  float* rstd;
  int64_t rows, L;
  int D;
  float eps;
  cudaStream_t stream;
};

template <typename T, int V, int kIters, int kTPR>
void launch_reg(const Args& a) {
  constexpr int kRows = rows_per_block<kTPR>();
  const int64_t blocks = (a.rows + kRows - 1) / kRows;
  if (blocks > INT_MAX)
    throw std::invalid_argument("launch_layernorm_modulate: too many rows (" +
                                std::to_string(a.rows) + ") for one launch");
  ln_mod_reg_kernel<T, V, kIters, kTPR><<<unsigned(blocks), dim3(kTPR, kRows), 0, a.stream>>>(
      static_cast<const T*>(a.x), a.shift, a.scale, a.y, a.mean, a.rstd, a.rows, a.L, a.D, a.eps);
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
  if (a.rows > INT_MAX)
    throw std::invalid_argument("launch_layernorm_modulate: too many rows (" +
                                std::to_string(a.rows) + ") for one launch");
  ln_mod_fallback_kernel<T, V><<<unsigned(a.rows), kFallbackThreads, 0, a.stream>>>(
      static_cast<const T*>(a.x), a.shift, a.scale, a.y, a.mean, a.rstd, a.L, a.D, a.eps);
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

void launch_layernorm_modulate(const void* x, bool x_is_bf16, const float* shift,
                               const float* scale, float* y, float* mean, float* rstd, int64_t B,
                               int64_t L, int64_t D, double eps, cudaStream_t stream) {
  if (B < 0 || L < 0 || D <= 0 || D > INT_MAX / 2)
    throw std::invalid_argument("launch_layernorm_modulate: bad sizes B=" + std::to_string(B) +
                                " L=" + std::to_string(L) + " D=" + std::to_string(D) +
                                " (need B, L >= 0 and 0 < D <= 2^30)");
  if (!(eps >= 0))
    throw std::invalid_argument("launch_layernorm_modulate: eps must be >= 0, got " +
                                std::to_string(eps));
  const int64_t rows = B * L;
  if (rows == 0) return;
  if (!x || !shift || !scale || !y)
    throw std::invalid_argument("launch_layernorm_modulate: x, shift, scale and y must be non-null");

  Args a{x, shift, scale, y, mean, rstd, rows, L, int(D), float(eps), stream};
  const bool vec = D % 4 == 0 && aligned(x, x_is_bf16 ? 8 : 16) && aligned(shift, 16) &&
                   aligned(scale, 16) && aligned(y, 16);
  if (x_is_bf16) {
    if (vec) launch_typed<__nv_bfloat16, 4>(a);
    else launch_typed<__nv_bfloat16, 1>(a);
  } else {
    if (vec) launch_typed<float, 4>(a);
    else launch_typed<float, 1>(a);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("launch_layernorm_modulate: kernel launch failed (B=") +
                             std::to_string(B) + " L=" + std::to_string(L) +
                             " D=" + std::to_string(D) + (x_is_bf16 ? " bf16" : " fp32") +
                             "): " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace vidit
