// The fused LayerNorm + modulate op as a torch autograd Function (built only against a CUDA
// torch, VIDIT_HAVE_CUDA). Forward: the CUDA kernel (layernorm_modulate.cu) on the current
// stream, which also writes the per-row mean and rstd. Backward: ATen math from the saved
// mean / rstd, with g = dL/dy and xhat = (x - mean) * rstd:
//   grad_shift = sum_l g                       grad_scale = sum_l g * xhat
//   grad_xhat  = g * (1 + scale)
//   grad_x     = rstd * (grad_xhat - mean_D(grad_xhat) - xhat * mean_D(grad_xhat * xhat))
// c10's stream / guard headers (what at::cuda::getCurrentCUDAStream is) rather than
// ATen/cuda/CUDAContext.h, which drags in cuBLAS / cuSPARSE headers.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "kernels/layernorm_modulate.h"
#include "kernels/layernorm_modulate_launch.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_inputs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  VIDIT_CHECK(x.defined() && shift.defined() && scale.defined(),
              "layernorm_modulate_fused: x, shift and scale must be defined tensors");
  VIDIT_CHECK(x.is_cuda(), "layernorm_modulate_fused: x must be a CUDA tensor, got ", x.device(),
              " (use layernorm_modulate() from model/layers.h, which falls back to ATen)");
  VIDIT_CHECK(shift.device() == x.device() && scale.device() == x.device(),
              "layernorm_modulate_fused: shift (", shift.device(), ") and scale (", scale.device(),
              ") must be on the device of x (", x.device(), ")");
  VIDIT_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "layernorm_modulate_fused: x must be float32 or bfloat16, got ", x.scalar_type());
  VIDIT_CHECK(shift.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat,
              "layernorm_modulate_fused: shift and scale must be float32 (modulation math is fp32), "
              "got ", shift.scalar_type(), " and ", scale.scalar_type());
  VIDIT_CHECK(x.dim() == 3, "layernorm_modulate_fused: x must be [B, L, D], got ", x.sizes());
  const int64_t B = x.size(0), D = x.size(2);
  VIDIT_CHECK(D > 0, "layernorm_modulate_fused: x has an empty last dimension ", x.sizes());
  for (const at::Tensor* t : {&shift, &scale})
    VIDIT_CHECK(t->dim() == 3 && t->size(0) == B && t->size(1) == 1 && t->size(2) == D,
                "layernorm_modulate_fused: shift and scale must be [B, 1, D] = [", B, ", 1, ", D,
                "] to match x ", x.sizes(), ", got shift ", shift.sizes(), " and scale ",
                scale.sizes());
}

struct LayerNormModulateFn : public torch::autograd::Function<LayerNormModulateFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in,
                            const at::Tensor& shift_in, const at::Tensor& scale_in, double eps) {
    check_inputs(x_in, shift_in, scale_in);
    const c10::cuda::CUDAGuard guard(x_in.device());
    // The kernel wants dense rows; chunked modulation ([B, 6, D].chunk(6, 1)) is strided.
    const at::Tensor x = x_in.contiguous();
    const at::Tensor shift = shift_in.contiguous();
    const at::Tensor scale = scale_in.contiguous();
    VIDIT_CHECK(x.is_contiguous() && shift.is_contiguous() && scale.is_contiguous(),
                "layernorm_modulate_fused: inputs could not be made contiguous");
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2);

    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor y = at::empty({B, L, D}, f32);
    at::Tensor mean = at::empty({B, L, 1}, f32);
    at::Tensor rstd = at::empty({B, L, 1}, f32);
    try {
      launch_layernorm_modulate(x.data_ptr(), x.scalar_type() == at::kBFloat16,
                                shift.data_ptr<float>(), scale.data_ptr<float>(),
                                y.data_ptr<float>(), mean.data_ptr<float>(),
                                rstd.data_ptr<float>(), B, L, D, eps,
                                c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("layernorm_modulate_fused: ", e.what());
    }
    ctx->save_for_backward({x, scale, mean, rstd});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& scale = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& rstd = saved[3];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const c10::cuda::CUDAGuard guard(x.device());

    at::Tensor grad_x, grad_shift, grad_scale;
    if (!grads[0].defined()) return {grad_x, grad_shift, grad_scale, at::Tensor()};
    const at::Tensor g = grads[0].to(at::kFloat);
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_shift = ctx->needs_input_grad(1);
    const bool need_scale = ctx->needs_input_grad(2);

    if (need_shift) grad_shift = g.sum(1, /*keepdim=*/true);
    if (need_x || need_scale) {
      const at::Tensor xhat = (x.to(at::kFloat) - mean) * rstd;
      if (need_scale) grad_scale = (g * xhat).sum(1, /*keepdim=*/true);
      if (need_x) {
        const at::Tensor gxh = g * (1 + scale);
        const at::Tensor c1 = gxh.mean(-1, /*keepdim=*/true);
        const at::Tensor c2 = (gxh * xhat).mean(-1, /*keepdim=*/true);
        grad_x = (rstd * (gxh - c1 - xhat * c2)).to(x_dtype);
      }
    }
    return {grad_x, grad_shift, grad_scale, at::Tensor()};
  }
};

}  // namespace

bool layernorm_modulate_cuda_available() { return true; }

at::Tensor layernorm_modulate_fused(const at::Tensor& x, const at::Tensor& shift,
                                    const at::Tensor& scale, double eps) {
  check_inputs(x, shift, scale);
  return LayerNormModulateFn::apply(x, shift, scale, eps);
}

}  // namespace vidit
