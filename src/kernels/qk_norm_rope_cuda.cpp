// The fused QK RMSNorm + RoPE op as a torch autograd Function (built only against a CUDA torch,
// VIDIT_HAVE_CUDA). Forward and backward are the kernels of qk_norm_rope.cu on the current
// stream; the forward keeps x and the per-row rstd (4 bytes a token) for the backward, which
// writes dx and per-block partial sums of dweight that one ATen sum adds up.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/qk_norm_rope_launch.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_inputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                  int64_t heads) {
  VIDIT_CHECK(x.defined() && weight.defined() && cos.defined() && sin.defined(),
              "qk_norm_rope_fused: x, weight, cos and sin must be defined tensors");
  VIDIT_CHECK(x.is_cuda(), "qk_norm_rope_fused: x must be a CUDA tensor, got ", x.device());
  for (const at::Tensor* t : {&weight, &cos, &sin})
    VIDIT_CHECK(t->device() == x.device() && t->scalar_type() == at::kFloat,
                "qk_norm_rope_fused: weight, cos and sin must be float32 on ", x.device(), ", got ",
                t->scalar_type(), " on ", t->device());
  VIDIT_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "qk_norm_rope_fused: x must be float32 or bfloat16, got ", x.scalar_type());
  VIDIT_CHECK(x.dim() == 3 && heads > 0 && x.size(2) % heads == 0 && (x.size(2) / heads) % 2 == 0,
              "qk_norm_rope_fused: x must be [B, L, D] with D split into ", heads, " heads of an even size, got ",
              x.sizes());
  const int64_t L = x.size(1), D = x.size(2), half = D / heads / 2;
  VIDIT_CHECK(weight.dim() == 1 && weight.size(0) == D, "qk_norm_rope_fused: weight must be [", D, "], got ",
              weight.sizes());
  VIDIT_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == L && cos.size(1) == half,
              "qk_norm_rope_fused: cos and sin must be [L, head_dim / 2] = [", L, ", ", half, "], got ", cos.sizes(),
              " and ", sin.sizes());
}

// Runs a launcher, turning its std exceptions into vidit errors that name the op.
template <typename F>
void launch(const F& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("qk_norm_rope_fused: ", e.what());
  }
}

struct QkNormRopeFn : public torch::autograd::Function<QkNormRopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight_in,
                            const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t heads, double eps) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor y = at::empty({B, L, heads, D / heads}, f32);
    at::Tensor rstd = at::empty({B * L}, f32);
    launch([&] {
      launch_qk_norm_rope_forward(x.data_ptr(), x.scalar_type() == at::kBFloat16, weight.data_ptr<float>(),
                                  cos.data_ptr<float>(), sin.data_ptr<float>(), y.data_ptr<float>(),
                                  rstd.data_ptr<float>(), B, L, D, D / heads, eps,
                                  c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    });
    ctx->save_for_backward({x, weight, cos, sin, rstd});
    ctx->saved_data["heads"] = heads;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &cos = saved[2], &sin = saved[3], &rstd = saved[4];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const variable_list none(6);
    if (!grads[0].defined()) return none;
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
    const at::Tensor gy = grads[0].to(at::kFloat).contiguous();
    at::Tensor grad_x = at::empty_like(x);
    at::Tensor partial = at::empty({qk_norm_rope_backward_blocks(B * L), D}, x.options().dtype(at::kFloat));
    launch([&] {
      launch_qk_norm_rope_backward(x.data_ptr(), x.scalar_type() == at::kBFloat16, weight.data_ptr<float>(),
                                   cos.data_ptr<float>(), sin.data_ptr<float>(), rstd.data_ptr<float>(),
                                   gy.data_ptr<float>(), grad_x.data_ptr(), partial.data_ptr<float>(), B, L, D,
                                   D / heads, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    });
    variable_list out = none;
    if (ctx->needs_input_grad(0)) out[0] = grad_x;
    if (ctx->needs_input_grad(1)) out[1] = B * L > 0 ? partial.sum(0) : at::zeros_like(weight);
    return out;
  }
};

}  // namespace

bool qk_norm_rope_cuda_available() { return true; }

at::Tensor qk_norm_rope_fused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t heads, double eps) {
  check_inputs(x, weight, cos, sin, heads);
  return QkNormRopeFn::apply(x, weight, cos.detach(), sin.detach(), heads, eps);
}

}  // namespace vidit
