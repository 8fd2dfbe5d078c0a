// The fp64 reference of the fused QK RMSNorm + RoPE op, both directions (kernels/qk_norm_rope.h),
// and the stand-in entry points of a build without CUDA.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/qk_norm_rope.h"

namespace vidit {
namespace {

// fp64 CPU copies of the inputs, with their sizes checked.
struct Ref {
  at::Tensor x, w, cos, sin;
  int64_t rows, L, D, half;
  Ref(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
      int64_t heads) {
    VIDIT_CHECK(x_in.dim() == 3 && heads > 0 && x_in.size(2) % heads == 0 && (x_in.size(2) / heads) % 2 == 0,
                "qk_norm_rope_reference: x must be [B, L, D] with D split into ", heads, " even heads, got ",
                x_in.sizes());
    auto f64 = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble).contiguous(); };
    x = f64(x_in), w = f64(w_in), cos = f64(cos_in), sin = f64(sin_in);
    L = x.size(1), D = x.size(2), rows = x.size(0) * L, half = D / heads / 2;
    VIDIT_CHECK(w.numel() == D && cos.numel() == L * half && sin.numel() == L * half,
                "qk_norm_rope_reference: weight must have D = ", D, " values and cos / sin L x head_dim / 2 = ", L,
                " x ", half);
  }
  double rstd(const double* xr, double eps) const {
    double ms = 0;
    for (int64_t c = 0; c < D; ++c) ms += xr[c] * xr[c];
    return 1.0 / std::sqrt(ms / double(D) + eps);
  }
};

}  // namespace

at::Tensor qk_norm_rope_reference(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& cos_in,
                                  const at::Tensor& sin_in, int64_t heads, double eps) {
  const Ref r(x_in, weight, cos_in, sin_in, heads);
  at::Tensor y = at::empty_like(r.x);
  const double *x = r.x.data_ptr<double>(), *w = r.w.data_ptr<double>();
  const double *cs = r.cos.data_ptr<double>(), *sn = r.sin.data_ptr<double>();
  double* out = y.data_ptr<double>();
  for (int64_t row = 0; row < r.rows; ++row) {
    const double* xr = x + row * r.D;
    const double rs = r.rstd(xr, eps);
    const int64_t l = row % r.L;
    for (int64_t p = 0; p < r.D / 2; ++p) {
      const int64_t j = p % r.half;
      const double a = xr[2 * p] * rs * w[2 * p], b = xr[2 * p + 1] * rs * w[2 * p + 1];
      const double c = cs[l * r.half + j], s = sn[l * r.half + j];
      out[row * r.D + 2 * p] = a * c - b * s;
      out[row * r.D + 2 * p + 1] = a * s + b * c;
    }
  }
  return y.view({x_in.size(0), r.L, heads, r.D / heads}).to(at::kFloat);
}

QkNormRopeGrads qk_norm_rope_backward_reference(const at::Tensor& x_in, const at::Tensor& weight,
                                                const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t heads,
                                                double eps, const at::Tensor& grad_y) {
  const Ref r(x_in, weight, cos_in, sin_in, heads);
  const at::Tensor gy = grad_y.detach().to(at::kCPU, at::kDouble).contiguous();
  VIDIT_CHECK(gy.numel() == r.rows * r.D, "qk_norm_rope_backward_reference: grad_y must be [B, L, heads, head_dim]");
  at::Tensor dx = at::empty_like(r.x), dw = at::zeros({r.D}, r.x.options());
  const double *x = r.x.data_ptr<double>(), *w = r.w.data_ptr<double>(), *g = gy.data_ptr<double>();
  const double *cs = r.cos.data_ptr<double>(), *sn = r.sin.data_ptr<double>();
  double *dxp = dx.data_ptr<double>(), *dwp = dw.data_ptr<double>();
  std::vector<double> gn(size_t(r.D));
  for (int64_t row = 0; row < r.rows; ++row) {
    const double* xr = x + row * r.D;
    const double* gr = g + row * r.D;
    const double rs = r.rstd(xr, eps);
    const int64_t l = row % r.L;
    // The gradient of the normalised, weighted row: grad_y turned back by the opposite angle.
    for (int64_t p = 0; p < r.D / 2; ++p) {
      const int64_t j = p % r.half;
      const double c = cs[l * r.half + j], s = sn[l * r.half + j];
      gn[size_t(2 * p)] = gr[2 * p] * c + gr[2 * p + 1] * s;
      gn[size_t(2 * p + 1)] = -gr[2 * p] * s + gr[2 * p + 1] * c;
    }
    double dot = 0;  // sum_c (gn * w)[c] * xn[c]
    for (int64_t c = 0; c < r.D; ++c) {
      dwp[c] += gn[size_t(c)] * xr[c] * rs;
      dot += gn[size_t(c)] * w[c] * xr[c] * rs;
    }
    for (int64_t c = 0; c < r.D; ++c)
      dxp[row * r.D + c] = rs * (gn[size_t(c)] * w[c] - xr[c] * rs * dot / double(r.D));
  }
  return {dx.to(at::kFloat), dw.to(at::kFloat)};
}

bool qk_norm_rope_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  if (!qk_norm_rope_cuda_available() || !x.is_cuda() || x.dim() != 3 || heads <= 0) return false;
  const int64_t L = x.size(1), D = x.size(2);
  if (D % heads || (D / heads) % 2 || D > kQkNormRopeMaxDim) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  for (const at::Tensor* t : {&cos, &sin})
    if (t->scalar_type() != at::kFloat || t->device() != x.device() || t->dim() != 2 || t->size(0) != L ||
        t->size(1) != D / heads / 2)
      return false;
  return true;
}

#ifndef VIDIT_HAVE_CUDA
bool qk_norm_rope_cuda_available() { return false; }
at::Tensor qk_norm_rope_fused(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                              double) {
  fail("qk_norm_rope_fused: this vidit build has no CUDA kernels; rebuild against a CUDA torch (see README, "
       "'Building against another torch')");
}
#endif

}  // namespace vidit
