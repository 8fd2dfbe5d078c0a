#include "kernels/rmsnorm_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per parallel task: enough work to amortise a task on rows as short as 48.
constexpr int64_t kGrain = 64;

template <typename T>
void forward_rows(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t D, double eps) {
  at::parallel_for(0, rows, kGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * D;
      T* yr = y + r * D;
      T ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const T s = T(1) / std::sqrt(ss / T(D) + T(eps));
      rstd[r] = s;
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * s * w[i];
    }
  });
}

// dx per row; dweight as per-task partial sums, added up after.
template <typename T>
void backward_rows(const T* gy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows,
                   int64_t D) {
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (rows + kGrain - 1) / kGrain));
  std::vector<T> partial(size_t(tasks * D), T(0));
  const int64_t per = (rows + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      T* acc = partial.data() + t * D;
      for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) {
        const T* gr = gy + r * D;
        const T* xr = x + r * D;
        T* dr = dx + r * D;
        const T s = rstd[r];
        T dot = 0;
        for (int64_t i = 0; i < D; ++i) dot += gr[i] * w[i] * xr[i];
        const T c = s * s * s * dot / T(D);
        for (int64_t i = 0; i < D; ++i) {
          dr[i] = s * gr[i] * w[i] - c * xr[i];
          acc[i] += gr[i] * xr[i] * s;
        }
      }
    }
  });
  for (int64_t i = 0; i < D; ++i) dw[i] = 0;
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < D; ++i) dw[i] += partial[size_t(t * D + i)];
}

struct RMSNormFn : torch::autograd::Function<RMSNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
    at::Tensor x = x_in.contiguous(), w = w_in.to(x.scalar_type()).contiguous();
    const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
    at::Tensor y = at::empty_like(x), rstd = at::empty({rows}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rmsnorm_cpu_forward", [&] {
      forward_rows<scalar_t>(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                             rstd.data_ptr<scalar_t>(), rows, D, eps);
    });
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w_in.scalar_type());
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    at::Tensor gy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
    at::Tensor dx = at::empty_like(x), dw = at::empty({D}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rmsnorm_cpu_backward", [&] {
      backward_rows<scalar_t>(gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                              rstd.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), rows, D);
    });
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {dx, dw.to(w_dtype), at::Tensor()};
  }
};

}  // namespace

at::Tensor rmsnorm_cpu_fused(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rmsnorm_cpu_fused: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "rmsnorm_cpu_fused: fp32 or fp64 input, got ", x.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rmsnorm_cpu_fused: weight ",
              weight.sizes(), " does not match the last dim of x ", x.sizes());
  return RMSNormFn::apply(x, weight, eps);
}

at::Tensor rmsnorm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * weight.to(x.scalar_type());
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool cpu_ok = x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  if (cpu_ok) return rmsnorm_cpu_fused(x, weight, eps);
  return at::rms_norm(x, {x.size(-1)}, weight.to(x.scalar_type()), eps);
}

}  // namespace vidit
