// The fused gated residual + LayerNorm + modulate op as a torch autograd Function (built only
// against a CUDA torch, VIDIT_HAVE_CUDA). Forward: the CUDA kernel (residual_layernorm.cu) on
// the current stream, which also writes the per-row mean and rstd of r. Backward: ATen math from
// the saved r / mean / rstd, given g_r = dL/dr and g_out = dL/dout (either may be undefined),
// with xhat = (r - mean) * rstd and absent operands at their neutral values:
//   grad_shift  = sum_l g_out                    grad_scale = sum_l g_out * (xhat * w + bias)
//   grad_weight = sum_bl g_out * (1 + scale) * xhat    grad_bias = sum_bl g_out * (1 + scale)
//   gxh         = g_out * w * (1 + scale)
//   grad_r      = g_r + rstd * (gxh - mean_D(gxh) - xhat * mean_D(gxh * xhat))
//   grad_x      = grad_r    grad_y = grad_r * gate (in y's dtype)    grad_gate = sum_l grad_r * y
// residual_layernorm_backward_reference() (residual_layernorm_ref.cpp) is the same in fp64.
// c10's stream / guard headers rather than ATen/cuda/CUDAContext.h, which drags in cuBLAS /
// cuSPARSE headers.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "kernels/residual_layernorm.h"
#include "kernels/residual_layernorm_launch.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kOp = "residual_layernorm_fused";

// An optional fp32 operand: undefined, or on x's device with the given shape.
void check_optional(const char* name, const at::Tensor& t, const at::Tensor& x,
                    at::IntArrayRef shape) {
  if (!t.defined()) return;
  VIDIT_CHECK(t.device() == x.device(), kOp, ": ", name, " is on ", t.device(),
              " but must be on the device of x (", x.device(), ")");
  VIDIT_CHECK(t.scalar_type() == at::kFloat, kOp, ": ", name,
              " must be float32 (the norm and modulation math is fp32), got ", t.scalar_type());
  VIDIT_CHECK(t.sizes() == shape, kOp, ": ", name, " must be ", shape, " to match x ", x.sizes(),
              " (or undefined), got ", t.sizes());
}

void check_inputs(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate,
                  const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& shift,
                  const at::Tensor& scale) {
  VIDIT_CHECK(x.defined() && y.defined(), kOp, ": x and y must be defined tensors");
  VIDIT_CHECK(x.is_cuda(), kOp, ": x must be a CUDA tensor, got ", x.device(),
              " (use residual_layernorm_composite() on other devices)");
  VIDIT_CHECK(y.device() == x.device(), kOp, ": y is on ", y.device(),
              " but must be on the device of x (", x.device(), ")");
  VIDIT_CHECK(x.scalar_type() == at::kFloat,
              kOp, ": x (the residual stream) must be float32, got ", x.scalar_type());
  VIDIT_CHECK(y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16,
              kOp, ": y must be float32 or bfloat16, got ", y.scalar_type());
  VIDIT_CHECK(x.dim() == 3 && x.size(2) > 0, kOp, ": x must be [B, L, D] with D > 0, got ",
              x.sizes());
  VIDIT_CHECK(y.sizes() == x.sizes(), kOp, ": y must have the shape of x ", x.sizes(), ", got ",
              y.sizes());
  const int64_t B = x.size(0), D = x.size(2);
  check_optional("gate", gate, x, {B, 1, D});
  check_optional("weight", weight, x, {D});
  check_optional("bias", bias, x, {D});
  check_optional("shift", shift, x, {B, 1, D});
  check_optional("scale", scale, x, {B, 1, D});
}

// The kernel wants dense rows; chunked modulation ([B, 6, D].chunk(6, 1)) is strided.
at::Tensor dense(const at::Tensor& t) { return t.defined() ? t.contiguous() : t; }

const float* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

struct ResidualLayerNormFn : public torch::autograd::Function<ResidualLayerNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               const at::Tensor& y_in, const at::Tensor& gate_in,
                               const at::Tensor& weight_in, const at::Tensor& bias_in,
                               const at::Tensor& shift_in, const at::Tensor& scale_in,
                               double eps) {
    check_inputs(x_in, y_in, gate_in, weight_in, bias_in, shift_in, scale_in);
    const c10::cuda::CUDAGuard guard(x_in.device());
    const at::Tensor x = dense(x_in), y = dense(y_in), gate = dense(gate_in),
                     weight = dense(weight_in), bias = dense(bias_in), shift = dense(shift_in),
                     scale = dense(scale_in);
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2);

    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor r = at::empty({B, L, D}, f32);
    at::Tensor out = at::empty({B, L, D}, f32);
    at::Tensor mean = at::empty({B, L, 1}, f32);
    at::Tensor rstd = at::empty({B, L, 1}, f32);
    try {
      launch_residual_layernorm(x.data_ptr<float>(), y.data_ptr(),
                                y.scalar_type() == at::kBFloat16, ptr_or_null(gate),
                                ptr_or_null(weight), ptr_or_null(bias), ptr_or_null(shift),
                                ptr_or_null(scale), r.data_ptr<float>(), out.data_ptr<float>(),
                                mean.data_ptr<float>(), rstd.data_ptr<float>(), B, L, D, eps,
                                c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(kOp, ": ", e.what());
    }
    // Either output may go unused (undefined grad): do not materialize zeros for it.
    ctx->set_materialize_grads(false);
    // y is only needed for grad_gate; keep it alive only then.
    const bool keep_y = gate.defined() && gate_in.requires_grad();
    ctx->save_for_backward({r, mean, rstd, keep_y ? y : at::Tensor(), gate, weight, bias, scale});
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y_in.scalar_type());
    return {r, out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &r = saved[0], &mean = saved[1], &rstd = saved[2], &y = saved[3],
                     &gate = saved[4], &weight = saved[5], &bias = saved[6], &scale = saved[7];
    const auto y_dtype = static_cast<at::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    const at::Tensor g_r = grads[0].defined() ? grads[0].to(at::kFloat) : at::Tensor();
    const at::Tensor g_out = grads[1].defined() ? grads[1].to(at::kFloat) : at::Tensor();

    // One per forward argument: x, y, gate, weight, bias, shift, scale, eps.
    at::Tensor grad_x, grad_y, grad_gate, grad_weight, grad_bias, grad_shift, grad_scale;
    const bool need_x = ctx->needs_input_grad(0), need_y = ctx->needs_input_grad(1),
               need_gate = ctx->needs_input_grad(2) && gate.defined();
    const bool need_r = need_x || need_y || need_gate;
    const c10::cuda::CUDAGuard guard(r.device());

    at::Tensor grad_r = g_r;  // dL/dr in total: direct, plus through the norm
    if (g_out.defined()) {
      const at::Tensor xhat = (r - mean) * rstd;
      const at::Tensor gm = scale.defined() ? g_out * (1 + scale) : g_out;  // g_out * (1 + scale)
      if (ctx->needs_input_grad(5)) grad_shift = g_out.sum(1, /*keepdim=*/true);
      if (ctx->needs_input_grad(6) && scale.defined()) {
        at::Tensor n = weight.defined() ? xhat * weight : xhat;  // the norm's output
        if (bias.defined()) n = n + bias;
        grad_scale = (g_out * n).sum(1, /*keepdim=*/true);
      }
      if (ctx->needs_input_grad(3) && weight.defined()) grad_weight = (gm * xhat).sum(at::IntArrayRef{0, 1});
      if (ctx->needs_input_grad(4) && bias.defined()) grad_bias = gm.sum(at::IntArrayRef{0, 1});
      if (need_r) {
        const at::Tensor gxh = weight.defined() ? gm * weight : gm;
        const at::Tensor c1 = gxh.mean(-1, /*keepdim=*/true);
        const at::Tensor c2 = (gxh * xhat).mean(-1, /*keepdim=*/true);
        const at::Tensor through_norm = rstd * (gxh - c1 - xhat * c2);
        grad_r = g_r.defined() ? g_r + through_norm : through_norm;
      }
    }
    if (need_r && grad_r.defined()) {
      if (need_x) grad_x = grad_r;
      if (need_y) grad_y = (gate.defined() ? grad_r * gate : grad_r).to(y_dtype);
      if (need_gate) grad_gate = (grad_r * y.to(at::kFloat)).sum(1, /*keepdim=*/true);
    }
    return {grad_x, grad_y, grad_gate, grad_weight, grad_bias, grad_shift, grad_scale,
            at::Tensor()};
  }
};

}  // namespace

bool residual_layernorm_cuda_available() { return true; }

ResidualNorm residual_layernorm_fused(const at::Tensor& x, const at::Tensor& y,
                                      const at::Tensor& gate, const at::Tensor& weight,
                                      const at::Tensor& bias, const at::Tensor& shift,
                                      const at::Tensor& scale, double eps) {
  check_inputs(x, y, gate, weight, bias, shift, scale);
  const variable_list o = ResidualLayerNormFn::apply(x, y, gate, weight, bias, shift, scale, eps);
  return {o[0], o[1]};
}

}  // namespace vidit
