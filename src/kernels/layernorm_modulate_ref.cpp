// CPU reference of the fused LayerNorm + modulate op, and the stand-in entry points used when
// the build has no CUDA.
#include "core/error.h"
#include "kernels/layernorm_modulate.h"

namespace vidit {

at::Tensor layernorm_modulate_reference(const at::Tensor& x_in, const at::Tensor& shift_in,
                                        const at::Tensor& scale_in, double eps) {
  VIDIT_CHECK(x_in.dim() == 3 && shift_in.dim() == 3 && scale_in.dim() == 3,
              "layernorm_modulate: x must be [B, L, D] and shift/scale [B, 1, D]");
  at::Tensor x = x_in.detach().to(at::kCPU, at::kDouble).contiguous();
  at::Tensor sh = shift_in.detach().to(at::kCPU, at::kDouble).contiguous();
  at::Tensor sc = scale_in.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  VIDIT_CHECK(sh.size(0) == B && sh.size(2) == D && sc.size(0) == B && sc.size(2) == D,
              "layernorm_modulate: shift/scale must be [B, 1, D] matching x");
  at::Tensor y = at::empty({B, L, D}, x.options());
  const double* xp = x.data_ptr<double>();
  const double* shp = sh.data_ptr<double>();
  const double* scp = sc.data_ptr<double>();
  double* yp = y.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const double* row = xp + (b * L + l) * D;
      double mean = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) mean += row[d];
      mean /= D;
      for (int64_t d = 0; d < D; ++d) var += (row[d] - mean) * (row[d] - mean);
      double rstd = 1.0 / std::sqrt(var / D + eps);
      for (int64_t d = 0; d < D; ++d)
        yp[(b * L + l) * D + d] = (row[d] - mean) * rstd * (1 + scp[b * D + d]) + shp[b * D + d];
    }
  return y.to(at::kFloat);
}

#ifndef VIDIT_HAVE_CUDA
bool layernorm_modulate_cuda_available() { return false; }
at::Tensor layernorm_modulate_fused(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  fail("layernorm_modulate_fused: this vidit build has no CUDA kernels; rebuild against a CUDA "
       "torch (see README, 'Building against another torch')");
}
#endif

}  // namespace vidit
