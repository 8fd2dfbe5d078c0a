// Fused QK RMSNorm + 3D RoPE, the step between the q (or k) projection and attention in every
// self-attention layer:
//   n[b, l, c] = x[b, l, c] * rstd[b, l] * weight[c],   rstd = 1 / sqrt(mean_c(x^2) + eps)
//   y[b, l, h, 2j]   = n[2j] * cos[l, j] - n[2j+1] * sin[l, j]      (within head h)
//   y[b, l, h, 2j+1] = n[2j] * sin[l, j] + n[2j+1] * cos[l, j]
// x [B, L, D] fp32 or bf16 (the norm spans all D channels, as Wan's does); weight [D] fp32;
// cos/sin [L, head_dim/2] fp32 (model/rope.h); y [B, L, heads, head_dim] fp32.
// On CUDA (qk_norm_rope.cu) the forward reads x once and writes y once, where the ATen path
// (a norm kernel, then select, four multiplies, add, sub, stack) makes about eight passes and
// keeps the normalised copy for backward. The backward is one kernel too: it turns the incoming
// gradient back by the opposite angle, and writes dx and per-block partial sums of dweight.
// The fp64 loops below are the ground truth of both directions.
#pragma once
#include <ATen/ATen.h>

#include "kernels/qk_norm_rope_limits.h"

namespace vidit {

// True when this build has the CUDA kernels (a CUDA torch at configure time).
bool qk_norm_rope_cuda_available();

// True when qk_norm_rope_fused takes these inputs: a CUDA build, x [B, L, D] fp32 or bf16 on a
// GPU with D split into `heads` even heads and D <= kQkNormRopeMaxDim, cos / sin fp32
// [L, head_dim / 2] on its device. The model falls back to its ATen path otherwise.
bool qk_norm_rope_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads);

// Differentiable fused op on CUDA tensors (gradients for x and weight). Throws vidit::Error
// without the CUDA build or for inputs it does not take.
at::Tensor qk_norm_rope_fused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t heads, double eps);

// Plain double-accumulating loops over CPU copies; returns fp32 y [B, L, heads, head_dim].
at::Tensor qk_norm_rope_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                  const at::Tensor& sin, int64_t heads, double eps);

// The gradients of the op for an incoming gradient grad_y [B, L, heads, head_dim], in fp64
// loops: grad_x [B, L, D] and grad_weight [D], both fp32.
struct QkNormRopeGrads {
  at::Tensor x, weight;
};
QkNormRopeGrads qk_norm_rope_backward_reference(const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                                                double eps, const at::Tensor& grad_y);

}  // namespace vidit
