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

AdamW::AdamW(const TensorMap& params, AdamWOptions opt, const TensorMap& decay_reference) : opt_(opt) {
  for (const auto& [name, p] : params) {
    auto ref = decay_reference.find(name);
    const bool decay = !no_decay(name, ref == decay_reference.end() ? p : ref->second);
    slots_.push_back({name, p, at::zeros_like(p, at::kFloat), at::zeros_like(p, at::kFloat),
                      at::zeros({}, p.options().dtype(at::kFloat)), decay});
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard ng;
  ++step_;
  for (bool decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, steps;
    for (auto& s : slots_) {
      if (s.decay != decay || !s.param.grad().defined()) continue;
      s.step.add_(1);
      p.push_back(s.param), g.push_back(s.param.grad()), m.push_back(s.exp_avg);
      v.push_back(s.exp_avg_sq), steps.push_back(s.step);
    }
    if (p.empty()) continue;
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, opt_.beta1, opt_.beta2,
                      decay ? opt_.weight_decay : 0.0, opt_.eps, /*amsgrad=*/false, /*maximize=*/false);
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

namespace {
const at::Tensor& state_entry(const TensorMap& state, const std::string& key, const at::Tensor& like,
                              const std::string& source) {
  auto it = state.find(key);
  VIDIT_CHECK(it != state.end(), "optimizer state '", source, "' has no key '", key,
              "': was it written for another model config?");
  VIDIT_CHECK(it->second.sizes().equals(like.sizes()), "optimizer state '", source, "': key '", key,
              "' has shape ", it->second.sizes(), " but the parameter has ", like.sizes());
  return it->second;
}
}  // namespace

void AdamW::check_state(const TensorMap& state, const std::string& source) const {
  VIDIT_CHECK(state_entry(state, "step", at::empty({1}), source).numel() == 1, "optimizer state '", source,
              "': 'step' is not one number");
  for (const auto& s : slots_) {
    state_entry(state, "exp_avg/" + s.name, s.exp_avg, source);
    state_entry(state, "exp_avg_sq/" + s.name, s.exp_avg_sq, source);
  }
}

void AdamW::load_state(const TensorMap& state, const std::string& source) {
  check_state(state, source);
  at::NoGradGuard ng;
  for (auto& s : slots_) {
    s.exp_avg.copy_(state.at("exp_avg/" + s.name));
    s.exp_avg_sq.copy_(state.at("exp_avg_sq/" + s.name));
  }
  step_ = state.at("step").item<int64_t>();
  for (auto& s : slots_) s.step.fill_(double(step_));
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  const double total = at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
  if (max_norm > 0 && total > max_norm) at::_foreach_mul_(grads, max_norm / (total + 1e-6));
  return total;
}

}  // namespace vidit
