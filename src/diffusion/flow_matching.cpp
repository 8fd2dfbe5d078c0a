#include "diffusion/flow_matching.h"

#include <cmath>

namespace vidit {

at::Tensor shift_sigma(const at::Tensor& sigma, double s) {
  return s * sigma / (1 + (s - 1) * sigma);
}

at::Tensor sample_sigmas(int64_t B, const DiffusionConfig& cfg, at::Generator& gen) {
  at::Tensor sigma;
  if (cfg.timestep_sampling == TimestepSampling::uniform)
    sigma = at::rand({B}, gen, at::kFloat);
  else
    sigma = at::sigmoid(at::normal(cfg.logit_mean, cfg.logit_std, {B}, gen, at::kFloat));
  return shift_sigma(sigma, cfg.shift);
}

SigmaRange sigma_range(Expert expert, double boundary) {
  if (expert == Expert::high) return {boundary, 1.0};
  if (expert == Expert::low) return {0.0, boundary};
  return {};
}

at::Tensor sample_sigmas(int64_t B, const DiffusionConfig& cfg, at::Generator& gen, SigmaRange range) {
  if (range.lo <= 0 && range.hi >= 1) return sample_sigmas(B, cfg, gen);
  // The unshifted sigma x of a shifted s': s' = s x / (1 + (s - 1) x)  <=>  x = s' / (s - (s - 1) s').
  const double s = cfg.shift;
  auto unshift = [s](double v) { return v / (s - (s - 1) * v); };
  const double xlo = unshift(range.lo), xhi = unshift(range.hi);
  const at::Tensor u = at::rand({B}, gen, at::kDouble);
  at::Tensor x;
  if (cfg.timestep_sampling == TimestepSampling::uniform) {
    x = xlo + (xhi - xlo) * u;
  } else {
    // x = sigmoid(m + sd z), z ~ N(0, 1) cut to [z(xlo), z(xhi)): through the normal CDF.
    auto cdf_of = [&](double v) {
      if (v <= 0) return 0.0;
      if (v >= 1) return 1.0;
      const double z = (std::log(v / (1 - v)) - cfg.logit_mean) / cfg.logit_std;
      return 0.5 * std::erfc(-z / std::sqrt(2.0));
    };
    const double plo = cdf_of(xlo), phi = cdf_of(xhi);
    const at::Tensor z = at::special_ndtri((plo + (phi - plo) * u).clamp(1e-300, 1.0 - 1e-16));
    x = at::sigmoid(cfg.logit_mean + cfg.logit_std * z);
  }
  // In fp32 (the sigmas' dtype), then kept inside the range: rounding to fp32 may reach an end.
  const float lo = float(range.lo) < range.lo ? std::nextafter(float(range.lo), 2.0f) : float(range.lo);
  const float hi = float(range.hi) < range.hi ? float(range.hi) : std::nextafter(float(range.hi), 0.0f);
  return shift_sigma(x, s).to(at::kFloat).clamp(lo, hi);
}

FlowSample make_flow_sample(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& sigma) {
  std::vector<int64_t> view(x0.dim(), 1);
  view[0] = x0.size(0);
  at::Tensor s = sigma.to(x0.options()).view(view);
  return {(1 - s) * x0 + s * noise, noise - x0, sigma.to(x0.device()) * 1000.0};
}

at::Tensor flow_loss(const at::Tensor& pred, const at::Tensor& target) {
  return at::mse_loss(pred.to(at::kFloat), target.to(at::kFloat));
}

std::vector<double> sample_losses(const at::Tensor& pred, const at::Tensor& target, int64_t rows) {
  if (rows <= 0) return {};
  at::NoGradGuard ng;
  const at::Tensor d = pred.detach().narrow(0, 0, rows).to(at::kFloat) - target.narrow(0, 0, rows).to(at::kFloat);
  const at::Tensor own = d.pow(2).flatten(1).mean(1).to(at::kDouble).cpu().contiguous();
  return std::vector<double>(own.data_ptr<double>(), own.data_ptr<double>() + rows);
}

at::Tensor sample_text_keep(int64_t B, double p, at::Generator& gen) { return at::rand({B}, gen, at::kFloat) >= p; }

at::Tensor drop_text(const at::Tensor& text, const at::Tensor& null_text, const at::Tensor& keep) {
  at::Tensor null = null_text.dim() == 2 ? null_text.unsqueeze(0) : null_text;
  return at::where(keep.view({-1, 1, 1}).to(text.device()), text, null.to(text.options()));
}

at::Tensor drop_text(const at::Tensor& text, const at::Tensor& null_text, double p, at::Generator& gen) {
  return drop_text(text, null_text, sample_text_keep(text.size(0), p, gen));
}

}  // namespace vidit
