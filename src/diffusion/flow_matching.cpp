#include "diffusion/flow_matching.h"

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
