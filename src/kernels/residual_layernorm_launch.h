// Plain launcher of the fused gated residual + LayerNorm + adaLN modulation CUDA kernel
// (residual_layernorm.cu). No torch types here, so the .cu file compiles with nvcc alone;
// residual_layernorm_cuda.cpp wraps it in a torch autograd Function.
//
//   r[b, l, :]   = x[b, l, :] + y[b, l, :] * gate[b, 0, :]
//   out[b, l, :] = ((r - mean) * rstd * weight + bias) * (1 + scale[b, 0, :]) + shift[b, 0, :]
//
// x       [B, L, D] contiguous fp32
// y       [B, L, D] contiguous, fp32 (y_is_bf16 = false) or bf16 (y_is_bf16 = true)
// gate    [B, 1, D] contiguous fp32, or nullptr (gate = 1)
// weight  [D] fp32, or nullptr (1)          bias  [D] fp32, or nullptr (0)
// shift   [B, 1, D] contiguous fp32, or nullptr (0)
// scale   [B, 1, D] contiguous fp32, or nullptr (0)
// r       [B, L, D] contiguous fp32, the residual (must not alias any input or out)
// out     [B, L, D] contiguous fp32 (must not alias any input or r)
// mean    [B * L] fp32, per-row mean of r (may be nullptr: not written)
// rstd    [B * L] fp32, per-row 1 / sqrt(var + eps) of r, biased variance (may be nullptr)
// All pointers are device pointers on the device current for `stream`.
// Throws std::invalid_argument for bad sizes or a missing x / y / r / out, and
// std::runtime_error (with the CUDA error string) when the launch fails. B * L == 0 launches
// nothing.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace vidit {

void launch_residual_layernorm(const float* x, const void* y, bool y_is_bf16, const float* gate,
                               const float* weight, const float* bias, const float* shift,
                               const float* scale, float* r, float* out, float* mean, float* rstd,
                               int64_t B, int64_t L, int64_t D, double eps, cudaStream_t stream);

}  // namespace vidit
