// Plain launchers of the fused QK RMSNorm + RoPE kernels (qk_norm_rope.cu). No torch types, so
// the .cu file compiles with nvcc alone; qk_norm_rope_cuda.cpp wraps them in an autograd Function.
// The op and its symbols: kernels/qk_norm_rope.h. All pointers are device pointers on the device
// current for `stream`, every tensor dense (row-major):
//   x        [B * L, D]  fp32 (x_is_bf16 = false) or bf16
//   weight   [D] fp32;   cos, sin [L, head_dim / 2] fp32
//   y        [B * L, D] fp32 (heads are consecutive runs of head_dim channels)
//   rstd     [B * L] fp32, written by the forward and read by the backward
//   grad_y   [B * L, D] fp32;  grad_x [B * L, D] in x's dtype
//   grad_weight_partial  [qk_norm_rope_backward_blocks(B * L), D] fp32: per-block sums over rows,
//            which the caller adds up
// D and head_dim even, head_dim divides D, D <= kQkNormRopeMaxDim (the backward keeps a row of partial
// sums in shared memory). Throws std::invalid_argument for bad sizes and std::runtime_error
// (with the CUDA error) when a launch fails. B * L == 0 launches nothing.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/qk_norm_rope_limits.h"

namespace vidit {

inline int64_t qk_norm_rope_backward_blocks(int64_t rows) { return rows < 1024 ? rows : 1024; }


void launch_qk_norm_rope_forward(const void* x, bool x_is_bf16, const float* weight, const float* cos,
                                 const float* sin, float* y, float* rstd, int64_t B, int64_t L, int64_t D,
                                 int64_t head_dim, double eps, cudaStream_t stream);

void launch_qk_norm_rope_backward(const void* x, bool x_is_bf16, const float* weight, const float* cos,
                                  const float* sin, const float* rstd, const float* grad_y, void* grad_x,
                                  float* grad_weight_partial, int64_t B, int64_t L, int64_t D, int64_t head_dim,
                                  cudaStream_t stream);

}  // namespace vidit
