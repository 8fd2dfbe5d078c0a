#include "kernels/rope_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// y = turn(x) by +angle (sign = 1) or -angle (sign = -1), over rows (b, l).
template <typename T>
void turn(const T* x, const T* cs, const T* sn, T* y, int64_t B, int64_t L, int64_t H, int64_t hd, T sign) {
  const int64_t half = hd / 2;
  at::parallel_for(0, B * L, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* c = cs + (r % L) * half;
      const T* s = sn + (r % L) * half;
      for (int64_t h = 0; h < H; ++h) {
        const T* xp = x + (r * H + h) * hd;
        T* yp = y + (r * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const T a = xp[2 * i], b = xp[2 * i + 1], si = sign * s[i];
          yp[2 * i] = a * c[i] - b * si;
          yp[2 * i + 1] = a * si + b * c[i];
        }
      }
    }
  });
}

at::Tensor run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double sign) {
  at::Tensor out = at::empty_like(x);
  at::Tensor c = cos.to(x.scalar_type()).contiguous(), s = sin.to(x.scalar_type()).contiguous();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rope_cpu", [&] {
    turn<scalar_t>(x.data_ptr<scalar_t>(), c.data_ptr<scalar_t>(), s.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                   x.size(0), x.size(1), x.size(2), x.size(3), scalar_t(sign));
  });
  return out;
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return run(x.contiguous(), cos, sin, 1.0);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    return {run(grads[0].contiguous(), saved[0], saved[1], -1.0), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rope_cpu_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu(), "rope_cpu_fused: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "rope_cpu_fused: fp32 or fp64 input, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope_cpu_fused: x must be [B, L, H, even hd], got ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == x.size(1) && cos.size(1) * 2 == x.size(3),
              "rope_cpu_fused: tables ", cos.sizes(), " do not match x ", x.sizes());
  TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(), "rope_cpu_fused: the tables take no gradient");
  return RopeFn::apply(x, cos, sin);
}

at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto sizes = x.sizes();
  at::Tensor pairs = x.reshape({sizes[0], sizes[1], sizes[2], sizes[3] / 2, 2});
  at::Tensor a = pairs.select(-1, 0), b = pairs.select(-1, 1);
  at::Tensor c = cos.unsqueeze(1).to(x.scalar_type()), s = sin.unsqueeze(1).to(x.scalar_type());  // [L, 1, d/2]
  return at::stack({a * c - b * s, a * s + b * c}, -1).reshape(sizes);
}

}  // namespace vidit
