// Fused LayerNorm (no affine) + adaLN modulation, the op at the entry of every DiT sub-block:
//   y[b, l, :] = (x[b, l, :] - mean) * rstd * (1 + scale[b, :]) + shift[b, :]
// x [B, L, D] (fp32 or bf16), shift/scale [B, 1, D] fp32; y fp32.
// The CUDA kernel (layernorm_modulate.cu) reads x once and writes y once, where the ATen
// composition makes four passes. Its backward is ATen math using the saved mean and rstd.
// layernorm_modulate_reference() is the plain CPU loop every implementation is tested against.
#pragma once
#include <ATen/ATen.h>

namespace vidit {

// True when this build has the CUDA kernel (a CUDA torch at configure time).
bool layernorm_modulate_cuda_available();

// Differentiable fused op on CUDA tensors. Throws vidit::Error without the CUDA build.
at::Tensor layernorm_modulate_fused(const at::Tensor& x, const at::Tensor& shift,
                                    const at::Tensor& scale, double eps);

// Plain double-accumulating loops over CPU tensors; the ground truth for tests.
at::Tensor layernorm_modulate_reference(const at::Tensor& x, const at::Tensor& shift,
                                        const at::Tensor& scale, double eps);

}  // namespace vidit
