// Fused gated residual + LayerNorm + adaLN modulation, the op between DiT sub-blocks:
//   r[b, l, :]   = x[b, l, :] + y[b, l, :] * gate[b, 0, :]                (the new residual stream)
//   out[b, l, :] = ((r - mean(r)) * rstd * w + bias) * (1 + scale[b, 0, :]) + shift[b, 0, :]
// with rstd = 1 / sqrt(biased var(r) + eps). Every piece but x and y is optional: an undefined
// tensor means gate = 1, w = 1, bias = 0, scale = 0, shift = 0.
//   x      [B, L, D] fp32              y            [B, L, D] fp32 or bf16
//   gate   [B, 1, D] fp32              weight, bias [D] fp32 (the LayerNorm affine)
//   shift, scale [B, 1, D] fp32        r, out       [B, L, D] fp32
// Strided [B, 1, D] views (chunks of the [B, 6, D] modulation) are accepted.
// The CUDA kernel (residual_layernorm.cu) reads x and y once and writes r and out once, where
// ATen makes a pass for the addcmul, the LayerNorm and the modulation each. Its backward is ATen
// math from the saved r, mean and rstd. residual_layernorm_reference() is the plain fp64 loop
// every implementation is tested against; residual_layernorm_composite() is the ATen version
// the model runs where the kernel does not apply.
#pragma once
#include <ATen/ATen.h>

namespace vidit {

struct ResidualNorm {
  at::Tensor residual;  // r, [B, L, D] fp32
  at::Tensor out;       // the normalized, affine-transformed, modulated r, [B, L, D] fp32
};

// True when this build has the CUDA kernel (a CUDA torch at configure time).
bool residual_layernorm_cuda_available();

// Differentiable fused op on CUDA tensors (gradients flow to every defined input that requires
// them, from either output). Throws vidit::Error for bad inputs and without the CUDA build.
ResidualNorm residual_layernorm_fused(const at::Tensor& x, const at::Tensor& y,
                                      const at::Tensor& gate, const at::Tensor& weight,
                                      const at::Tensor& bias, const at::Tensor& shift,
                                      const at::Tensor& scale, double eps);

// Plain fp64 loops over CPU copies of the inputs, returned as fp32 CPU tensors; the ground truth.
ResidualNorm residual_layernorm_reference(const at::Tensor& x, const at::Tensor& y,
                                          const at::Tensor& gate, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& shift,
                                          const at::Tensor& scale, double eps);

// The ATen composition (addcmul, layer_norm, addcmul), on any device, differentiable through
// ATen's autograd. Computes in fp32 (fp64 when x is fp64, which the gradient tests use).
ResidualNorm residual_layernorm_composite(const at::Tensor& x, const at::Tensor& y,
                                          const at::Tensor& gate, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& shift,
                                          const at::Tensor& scale, double eps);

// Gradients of the inputs, one per argument of the op; undefined where the input is.
struct ResidualNormGrads {
  at::Tensor x, y, gate, weight, bias, shift, scale;
};

// The backward formulas the CUDA op uses, in fp64 ATen math on the CPU, recomputing r, mean and
// rstd from the inputs. grad_residual / grad_out are dL/dr and dL/dout ([B, L, D]; either may be
// undefined, meaning zero). Returns fp64 CPU tensors shaped like the inputs; a test helper.
ResidualNormGrads residual_layernorm_backward_reference(
    const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& shift, const at::Tensor& scale, double eps,
    const at::Tensor& grad_residual, const at::Tensor& grad_out);

}  // namespace vidit
