// The fp64 CPU reference of the fused gated residual + LayerNorm + modulate op, its ATen
// composition (what the model runs without the kernel), the fp64 backward formulas the CUDA op
// implements, and the stand-in entry points used when the build has no CUDA.
#include <cmath>

#include "core/error.h"
#include "kernels/residual_layernorm.h"

namespace vidit {
namespace {

// Shapes only (any device and dtype): x, y [B, L, D]; gate, shift, scale [B, 1, D]; weight,
// bias [D]; the optional ones may be undefined.
void check_shapes(const char* op, const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate,
                  const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& shift,
                  const at::Tensor& scale) {
  VIDIT_CHECK(x.defined() && y.defined(), op, ": x and y must be defined tensors");
  VIDIT_CHECK(x.dim() == 3 && x.size(2) > 0, op, ": x must be [B, L, D] with D > 0, got ",
              x.sizes());
  VIDIT_CHECK(y.sizes() == x.sizes(), op, ": y must have the shape of x ", x.sizes(), ", got ",
              y.sizes());
  const int64_t B = x.size(0), D = x.size(2);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"gate", &gate},
                                {"shift", &shift},
                                {"scale", &scale}})
    VIDIT_CHECK(!t->defined() || (t->dim() == 3 && t->size(0) == B && t->size(1) == 1 &&
                                  t->size(2) == D),
                op, ": ", name, " must be [B, 1, D] = [", B, ", 1, ", D, "] or undefined, got ",
                t->sizes());
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{"weight", &weight}, {"bias", &bias}})
    VIDIT_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == D), op, ": ", name,
                " must be [D] = [", D, "] or undefined, got ", t->sizes());
}

// A contiguous fp64 CPU copy; undefined stays undefined.
at::Tensor f64(const at::Tensor& t) {
  return t.defined() ? t.detach().to(at::kCPU, at::kDouble).contiguous() : at::Tensor();
}

const double* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<double>() : nullptr; }

double value_or(const double* p, int64_t i, double fill) { return p ? p[i] : fill; }

}  // namespace

ResidualNorm residual_layernorm_reference(const at::Tensor& x_in, const at::Tensor& y_in,
                                          const at::Tensor& gate_in, const at::Tensor& weight_in,
                                          const at::Tensor& bias_in, const at::Tensor& shift_in,
                                          const at::Tensor& scale_in, double eps) {
  check_shapes("residual_layernorm_reference", x_in, y_in, gate_in, weight_in, bias_in, shift_in,
               scale_in);
  const at::Tensor x = f64(x_in), y = f64(y_in), gate = f64(gate_in), weight = f64(weight_in),
                   bias = f64(bias_in), shift = f64(shift_in), scale = f64(scale_in);
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  at::Tensor r = at::empty({B, L, D}, x.options());
  at::Tensor out = at::empty({B, L, D}, x.options());
  const double *xp = ptr(x), *yp = ptr(y), *gp = ptr(gate), *wp = ptr(weight), *bp = ptr(bias),
               *shp = ptr(shift), *scp = ptr(scale);
  double *rp = r.data_ptr<double>(), *op = out.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const int64_t row = (b * L + l) * D;
      double mean = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) {
        rp[row + d] = xp[row + d] + yp[row + d] * value_or(gp, b * D + d, 1);
        mean += rp[row + d];
      }
      mean /= D;
      for (int64_t d = 0; d < D; ++d) var += (rp[row + d] - mean) * (rp[row + d] - mean);
      const double rstd = 1.0 / std::sqrt(var / D + eps);
      for (int64_t d = 0; d < D; ++d) {
        const double n = (rp[row + d] - mean) * rstd * value_or(wp, d, 1) + value_or(bp, d, 0);
        op[row + d] = n * (1 + value_or(scp, b * D + d, 0)) + value_or(shp, b * D + d, 0);
      }
    }
  return {r.to(at::kFloat), out.to(at::kFloat)};
}

ResidualNorm residual_layernorm_composite(const at::Tensor& x, const at::Tensor& y,
                                          const at::Tensor& gate, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& shift,
                                          const at::Tensor& scale, double eps) {
  check_shapes("residual_layernorm_composite", x, y, gate, weight, bias, shift, scale);
  const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct), yf = y.to(ct);
  at::Tensor r = gate.defined() ? at::addcmul(xf, yf, gate) : xf + yf;
  at::Tensor out = at::layer_norm(r, {r.size(-1)}, weight, bias, eps);
  if (scale.defined())
    out = shift.defined() ? at::addcmul(shift, out, 1 + scale) : out * (1 + scale);
  else if (shift.defined())
    out = out + shift;
  return {r, out};
}

ResidualNormGrads residual_layernorm_backward_reference(
    const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& shift, const at::Tensor& scale, double eps,
    const at::Tensor& grad_residual, const at::Tensor& grad_out) {
  check_shapes("residual_layernorm_backward_reference", x, y, gate, weight, bias, shift, scale);
  for (const at::Tensor* g : {&grad_residual, &grad_out})
    VIDIT_CHECK(!g->defined() || g->sizes() == x.sizes(),
                "residual_layernorm_backward_reference: grad_residual and grad_out must have the "
                "shape of x ", x.sizes(), " or be undefined");
  const int64_t B = x.size(0), D = x.size(2);
  const auto f64opt = at::TensorOptions().dtype(at::kDouble);
  // Absent operands take their neutral values; their gradients are dropped at the end.
  const at::Tensor X = f64(x), Y = f64(y);
  const at::Tensor G = gate.defined() ? f64(gate) : at::ones({B, 1, D}, f64opt);
  const at::Tensor W = weight.defined() ? f64(weight) : at::ones({D}, f64opt);
  const at::Tensor Bi = bias.defined() ? f64(bias) : at::zeros({D}, f64opt);
  const at::Tensor S = scale.defined() ? f64(scale) : at::zeros({B, 1, D}, f64opt);
  const at::Tensor gr = grad_residual.defined() ? f64(grad_residual) : at::zeros_like(X);
  const at::Tensor go = grad_out.defined() ? f64(grad_out) : at::zeros_like(X);

  const at::Tensor r = X + Y * G;
  const at::Tensor mean = r.mean(-1, /*keepdim=*/true);
  const at::Tensor rstd = 1 / at::sqrt((r - mean).pow(2).mean(-1, /*keepdim=*/true) + eps);
  const at::Tensor xhat = (r - mean) * rstd;
  const at::Tensor m = 1 + S;

  ResidualNormGrads g;
  g.shift = go.sum(1, /*keepdim=*/true);
  g.scale = (go * (xhat * W + Bi)).sum(1, /*keepdim=*/true);
  g.weight = (go * m * xhat).sum(at::IntArrayRef{0, 1});
  g.bias = (go * m).sum(at::IntArrayRef{0, 1});
  const at::Tensor gxh = go * W * m;
  const at::Tensor total =
      gr + rstd * (gxh - gxh.mean(-1, true) - xhat * (gxh * xhat).mean(-1, true));
  g.x = total;
  g.y = total * G;
  g.gate = (total * Y).sum(1, /*keepdim=*/true);
  if (!gate.defined()) g.gate = at::Tensor();
  if (!weight.defined()) g.weight = at::Tensor();
  if (!bias.defined()) g.bias = at::Tensor();
  if (!shift.defined()) g.shift = at::Tensor();
  if (!scale.defined()) g.scale = at::Tensor();
  return g;
}

#ifndef VIDIT_HAVE_CUDA
bool residual_layernorm_cuda_available() { return false; }
ResidualNorm residual_layernorm_fused(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, double) {
  fail("residual_layernorm_fused: this vidit build has no CUDA kernels; rebuild against a CUDA "
       "torch (see README, 'Building against another torch')");
}
#endif

}  // namespace vidit
