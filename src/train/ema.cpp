#include "train/ema.h"

namespace vidit {

EMA::EMA(const TensorMap& params, double decay) : decay_(decay) {
  for (const auto& [name, p] : params) shadow_[name] = p.detach().to(at::kFloat).clone();
}

void EMA::update(const TensorMap& params) {
  at::NoGradGuard ng;
  const double d = std::min(decay_, (1.0 + updates_) / (10.0 + updates_));
  std::vector<at::Tensor> shadow, live;
  for (auto& [name, s] : shadow_) {
    shadow.push_back(s);
    live.push_back(params.at(name).detach().to(at::kFloat));
  }
  at::_foreach_lerp_(shadow, live, 1 - d);  // one multi-tensor call
  ++updates_;
}

}  // namespace vidit
