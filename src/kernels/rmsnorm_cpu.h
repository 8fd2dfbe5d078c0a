// Fused RMSNorm for CPU tensors, the QK norm of every attention layer:
//   y[r, :] = x[r, :] * rstd[r] * weight,   rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps)
// One pass forward and one pass backward over each row (at::parallel_for over rows), where
// autograd through the ATen composition (pow, mean, add, rsqrt, mul, mul) runs about twelve ops
// and allocates as many temporaries. x is fp32 or fp64, contiguous in its last dim; weight [D].
// The backward returns both gradients:
//   g = gy * weight;   dx = rstd * g - x * rstd^3 * mean(g * x);   dweight = sum_r gy * x * rstd
// rmsnorm_composite() is the ATen expression it is tested against (also the path for other
// devices and dtypes).
#pragma once
#include <ATen/ATen.h>

namespace vidit {

// Differentiable; CPU fp32/fp64 only (see rmsnorm()).
at::Tensor rmsnorm_cpu_fused(const at::Tensor& x, const at::Tensor& weight, double eps);

// The plain ATen composition (autograd through each op).
at::Tensor rmsnorm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);

// The fused CPU op where it applies, else ATen's rms_norm (fused on CUDA).
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace vidit
