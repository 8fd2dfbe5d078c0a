// Plain launcher of the fused LayerNorm (no affine) + adaLN modulation CUDA kernel
// (layernorm_modulate.cu). No torch types here, so the .cu file compiles with nvcc alone;
// layernorm_modulate_cuda.cpp wraps it in a torch autograd Function.
//
//   y[b, l, :] = (x[b, l, :] - mean) * rstd * (1 + scale[b, 0, :]) + shift[b, 0, :]
//
// x       [B, L, D] contiguous, fp32 (x_is_bf16 = false) or bf16 (x_is_bf16 = true)
// shift   [B, 1, D] contiguous fp32
// scale   [B, 1, D] contiguous fp32
// y       [B, L, D] contiguous fp32 (must not alias x)
// mean    [B * L] fp32, per-row mean of x (may be nullptr: not written)
// rstd    [B * L] fp32, per-row 1 / sqrt(var + eps), biased variance (may be nullptr)
// All pointers are device pointers on the device current for `stream`.
// Throws std::invalid_argument for bad sizes and std::runtime_error (with the CUDA error string)
// when the launch fails. B * L == 0 launches nothing.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace vidit {

void launch_layernorm_modulate(const void* x, bool x_is_bf16, const float* shift,
                               const float* scale, float* y, float* mean, float* rstd, int64_t B,
                               int64_t L, int64_t D, double eps, cudaStream_t stream);

}  // namespace vidit
