#include "train/adamw.h"

#include "core/error.h"

namespace vidit {

bool AdamW::no_decay(const std::string& name, const at::Tensor& p) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return p.dim() <= 1 || ends_with("bias") || ends_with("modulation") ||
         name.find("norm") != std::string::npos;
}

AdamW::AdamW(const TensorMap& params, AdamWOptions opt) : opt_(opt) {
  for (const auto& [name, p] : params)
    slots_.push_back({name, p, at::zeros_like(p, at::kFloat), at::zeros_like(p, at::kFloat),
                      !no_decay(name, p)});
}

void AdamW::step(double lr) {
  at::NoGradGuard ng;
  ++step_;
  const double bc1 = 1 - std::pow(opt_.beta1, double(step_));
  const double bc2 = 1 - std::pow(opt_.beta2, double(step_));
  for (auto& s : slots_) {
    const at::Tensor& g = s.param.grad();
    if (!g.defined()) continue;
    s.exp_avg.lerp_(g, 1 - opt_.beta1);
    s.exp_avg_sq.mul_(opt_.beta2).addcmul_(g, g, 1 - opt_.beta2);
    if (s.decay && opt_.weight_decay > 0) s.param.mul_(1 - lr * opt_.weight_decay);
    at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
    s.param.addcdiv_(s.exp_avg, denom, -lr / bc1);
  }
}

TensorMap AdamW::state() const {
  TensorMap out;
  out["step"] = at::tensor({step_}, at::kLong);
  for (const auto& s : slots_) {
    out["exp_avg/" + s.name] = s.exp_avg;
    out["exp_avg_sq/" + s.name] = s.exp_avg_sq;
  }
  return out;
}

void AdamW::load_state(const TensorMap& state, const std::string& source) {
  auto get = [&](const std::string& key, const at::Tensor& like) {
    auto it = state.find(key);
    VIDIT_CHECK(it != state.end(), "optimizer state '", source, "' has no key '", key,
                "': was it written for another model config?");
    VIDIT_CHECK(it->second.sizes().equals(like.sizes()), "optimizer state '", source, "': key '", key,
                "' has shape ", it->second.sizes(), " but the parameter has ", like.sizes());
    return it->second;
  };
  at::Tensor step = get("step", at::empty({1}));
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (auto& s : slots_) {
    copies.emplace_back(s.exp_avg, get("exp_avg/" + s.name, s.exp_avg));
    copies.emplace_back(s.exp_avg_sq, get("exp_avg_sq/" + s.name, s.exp_avg_sq));
  }
  at::NoGradGuard ng;
  for (auto& [dst, src] : copies) dst.copy_(src);
  step_ = step.item<int64_t>();
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().to(at::kFloat).pow(2).sum());
  if (norms.empty()) return 0.0;
  const double total = at::stack(norms).sum().sqrt().item<double>();
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
  return total;
}

}  // namespace vidit
