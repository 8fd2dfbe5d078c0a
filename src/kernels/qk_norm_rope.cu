// Fused QK RMSNorm + RoPE kernels (the op: kernels/qk_norm_rope.h; the launch contract:
// qk_norm_rope_launch.h). One block per row (token) in the forward: a first pass over the row
// sums the squares, a second reads the row again (from L1/L2: a row is at most 48 KiB) and
// writes each channel pair normalised, weighted and turned by its angle. Thread t handles pairs
// t, t + blockDim, ...; pair p is channel pair p % (head_dim / 2) of head p / (head_dim / 2).
// The backward runs qk_norm_rope_backward_blocks(rows) blocks, each over rows b, b + gridDim, ...;
// per row it turns grad_y back (gn = R(-angle) grad_y), forms g = gn * weight and
//   dx = rstd * (g - xn * mean_c(g * xn)),   xn = x * rstd,
// and adds gn * xn into the block's row of dweight partial sums, kept in shared memory.
// Pairs are loaded as 8-byte (fp32) or 4-byte (bf16) vectors when every pointer allows it.
#include "kernels/qk_norm_rope_launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vidit {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMaxD = kQkNormRopeMaxDim;

template <typename T, bool kVec>
__device__ __forceinline__ float2 load_pair(const T* p) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (kVec) return *reinterpret_cast<const float2*>(p);
    return make_float2(p[0], p[1]);
  } else {
    if constexpr (kVec) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    return make_float2(__bfloat162float(p[0]), __bfloat162float(p[1]));
  }
}

template <typename T, bool kVec>
__device__ __forceinline__ void store_pair(T* p, float a, float b) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (kVec) {
      *reinterpret_cast<float2*>(p) = make_float2(a, b);
    } else {
      p[0] = a, p[1] = b;
    }
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    if constexpr (kVec) {
      *reinterpret_cast<__nv_bfloat162*>(p) = v;
    } else {
      p[0] = v.x, p[1] = v.y;
    }
  }
}

// The sum of v over the block; every thread gets it. `red` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // the previous reduction's readers are done with `red`
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
    qk_norm_rope_forward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                                const float* __restrict__ cos, const float* __restrict__ sin,
                                float* __restrict__ y, float* __restrict__ rstd_out, int64_t L, int D,
                                int half_hd, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int pairs = D / 2;
  const T* xr = x + row * D;
  float sq = 0.f;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const float2 v = load_pair<T, kVec>(xr + 2 * p);
    sq += v.x * v.x + v.y * v.y;
  }
  const float rstd = rsqrtf(block_sum(sq, red) / float(D) + eps);
  const int64_t l = row % L;
  const float* cr = cos + l * half_hd;
  const float* sr = sin + l * half_hd;
  float* yr = y + row * D;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const float2 v = load_pair<T, kVec>(xr + 2 * p);
    const float2 w = load_pair<float, kVec>(weight + 2 * p);
    const int j = p % half_hd;
    const float a = v.x * rstd * w.x, b = v.y * rstd * w.y, c = cr[j], s = sr[j];
    store_pair<float, kVec>(yr + 2 * p, a * c - b * s, a * s + b * c);
  }
  if (threadIdx.x == 0) rstd_out[row] = rstd;
}

// Channel pair p of a row in the backward: xn = x * rstd, gn = grad_y turned back by the pair's
// angle (the gradient of the normalised, weighted row), g = gn * weight.
struct PairGrad {
  float2 xn, gn, g;
};
template <typename T, bool kVec>
__device__ __forceinline__ PairGrad pair_grad(const T* xr, const float* gr, const float* weight, const float* cr,
                                              const float* sr, int p, int half_hd, float rstd) {
  const float2 v = load_pair<T, kVec>(xr + 2 * p), gy = load_pair<float, kVec>(gr + 2 * p);
  const float2 w = load_pair<float, kVec>(weight + 2 * p);
  const int j = p % half_hd;
  const float c = cr[j], s = sr[j];
  PairGrad t;
  t.xn = make_float2(v.x * rstd, v.y * rstd);
  t.gn = make_float2(gy.x * c + gy.y * s, gy.y * c - gy.x * s);
  t.g = make_float2(t.gn.x * w.x, t.gn.y * w.y);
  return t;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
    qk_norm_rope_backward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                                 const float* __restrict__ cos, const float* __restrict__ sin,
                                 const float* __restrict__ rstd_in, const float* __restrict__ grad_y,
                                 T* __restrict__ grad_x, float* __restrict__ grad_weight_partial, int64_t rows,
                                 int64_t L, int D, int half_hd) {
  __shared__ float red[32];
  extern __shared__ float dw[];  // [D]: this block's sum over its rows of gn * xn
  const int pairs = D / 2;
  for (int c = threadIdx.x; c < D; c += blockDim.x) dw[c] = 0.f;
  __syncthreads();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float rstd = rstd_in[row];
    const int64_t l = row % L;
    const float* cr = cos + l * half_hd;
    const float* sr = sin + l * half_hd;
    const T* xr = x + row * D;
    const float* gr = grad_y + row * D;
    float dot = 0.f;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const PairGrad t = pair_grad<T, kVec>(xr, gr, weight, cr, sr, p, half_hd, rstd);
      dw[2 * p] += t.gn.x * t.xn.x;  // each thread owns its pairs: no two threads touch one entry
      dw[2 * p + 1] += t.gn.y * t.xn.y;
      dot += t.g.x * t.xn.x + t.g.y * t.xn.y;
    }
    const float mean_dot = block_sum(dot, red) / float(D);
    T* dxr = grad_x + row * D;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const PairGrad t = pair_grad<T, kVec>(xr, gr, weight, cr, sr, p, half_hd, rstd);
      store_pair<T, kVec>(dxr + 2 * p, rstd * (t.g.x - t.xn.x * mean_dot), rstd * (t.g.y - t.xn.y * mean_dot));
    }
  }
  __syncthreads();
  float* out = grad_weight_partial + int64_t(blockIdx.x) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) out[c] = dw[c];
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int threads_for(int64_t D) {
  const int64_t warps = (D / 2 + 31) / 32;
  return int(warps * 32 < kMaxThreads ? warps * 32 : kMaxThreads);
}

void check_sizes(const char* what, int64_t B, int64_t L, int64_t D, int64_t head_dim) {
  if (B < 0 || L < 0 || D <= 0 || D % 2 || D > kMaxD || head_dim <= 0 || head_dim % 2 || D % head_dim)
    throw std::invalid_argument(std::string(what) + ": bad sizes B=" + std::to_string(B) + " L=" +
                                std::to_string(L) + " D=" + std::to_string(D) + " head_dim=" +
                                std::to_string(head_dim) + " (need D and head_dim even, head_dim dividing D, D <= " +
                                std::to_string(kMaxD) + ")");
  if (B * L > INT_MAX) throw std::invalid_argument(std::string(what) + ": too many rows for one launch");
}

void check_launch(const char* what, int64_t B, int64_t L, int64_t D, bool bf16) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": kernel launch failed (B=" + std::to_string(B) + " L=" +
                             std::to_string(L) + " D=" + std::to_string(D) + (bf16 ? " bf16" : " fp32") +
                             "): " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

template <typename T, bool kVec>
void forward(const void* x, const float* weight, const float* cos, const float* sin, float* y, float* rstd,
             int64_t rows, int64_t L, int64_t D, int64_t head_dim, float eps, cudaStream_t stream) {
  qk_norm_rope_forward_kernel<T, kVec><<<unsigned(rows), threads_for(D), 0, stream>>>(
      static_cast<const T*>(x), weight, cos, sin, y, rstd, L, int(D), int(head_dim / 2), eps);
}

template <typename T, bool kVec>
void backward(const void* x, const float* weight, const float* cos, const float* sin, const float* rstd,
              const float* grad_y, void* grad_x, float* partial, int64_t rows, int64_t L, int64_t D,
              int64_t head_dim, cudaStream_t stream) {
  const size_t shared = size_t(D) * sizeof(float);
  qk_norm_rope_backward_kernel<T, kVec><<<unsigned(qk_norm_rope_backward_blocks(rows)), threads_for(D), shared, stream>>>(
      static_cast<const T*>(x), weight, cos, sin, rstd, grad_y, static_cast<T*>(grad_x), partial, rows, L, int(D),
      int(head_dim / 2));
}

}  // namespace

void launch_qk_norm_rope_forward(const void* x, bool x_is_bf16, const float* weight, const float* cos,
                                 const float* sin, float* y, float* rstd, int64_t B, int64_t L, int64_t D,
                                 int64_t head_dim, double eps, cudaStream_t stream) {
  check_sizes("launch_qk_norm_rope_forward", B, L, D, head_dim);
  if (!(eps >= 0)) throw std::invalid_argument("launch_qk_norm_rope_forward: eps must be >= 0");
  const int64_t rows = B * L;
  if (rows == 0) return;
  if (!x || !weight || !cos || !sin || !y || !rstd)
    throw std::invalid_argument("launch_qk_norm_rope_forward: every pointer must be non-null");
  const bool vec = aligned(x, x_is_bf16 ? 4 : 8) && aligned(weight, 8) && aligned(y, 8);
  if (x_is_bf16) {
    vec ? forward<__nv_bfloat16, true>(x, weight, cos, sin, y, rstd, rows, L, D, head_dim, float(eps), stream)
        : forward<__nv_bfloat16, false>(x, weight, cos, sin, y, rstd, rows, L, D, head_dim, float(eps), stream);
  } else {
    vec ? forward<float, true>(x, weight, cos, sin, y, rstd, rows, L, D, head_dim, float(eps), stream)
        : forward<float, false>(x, weight, cos, sin, y, rstd, rows, L, D, head_dim, float(eps), stream);
  }
  check_launch("launch_qk_norm_rope_forward", B, L, D, x_is_bf16);
}

void launch_qk_norm_rope_backward(const void* x, bool x_is_bf16, const float* weight, const float* cos,
                                  const float* sin, const float* rstd, const float* grad_y, void* grad_x,
                                  float* grad_weight_partial, int64_t B, int64_t L, int64_t D, int64_t head_dim,
                                  cudaStream_t stream) {
  check_sizes("launch_qk_norm_rope_backward", B, L, D, head_dim);
  const int64_t rows = B * L;
  if (rows == 0) return;
  if (!x || !weight || !cos || !sin || !rstd || !grad_y || !grad_x || !grad_weight_partial)
    throw std::invalid_argument("launch_qk_norm_rope_backward: every pointer must be non-null");
  const uintptr_t xa = x_is_bf16 ? 4 : 8;
  const bool vec = aligned(x, xa) && aligned(grad_x, xa) && aligned(weight, 8) && aligned(grad_y, 8);
  if (x_is_bf16) {
    vec ? backward<__nv_bfloat16, true>(x, weight, cos, sin, rstd, grad_y, grad_x, grad_weight_partial, rows, L, D,
                                        head_dim, stream)
        : backward<__nv_bfloat16, false>(x, weight, cos, sin, rstd, grad_y, grad_x, grad_weight_partial, rows, L, D,
                                         head_dim, stream);
  } else {
    vec ? backward<float, true>(x, weight, cos, sin, rstd, grad_y, grad_x, grad_weight_partial, rows, L, D, head_dim,
                                stream)
        : backward<float, false>(x, weight, cos, sin, rstd, grad_y, grad_x, grad_weight_partial, rows, L, D, head_dim,
                                 stream);
  }
  check_launch("launch_qk_norm_rope_backward", B, L, D, x_is_bf16);
}

}  // namespace vidit
