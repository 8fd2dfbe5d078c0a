#include "train/ema.h"

namespace vidit {

EMA::EMA(const TensorMap& params, double decay) : decay_(decay) {
  for (const auto& [name, p] : params) shadow_[name] = p.detach().to(at::kFloat).clone();
}

void EMA::update(const TensorMap& params) {
  at::NoGradGuard ng;
  const double d = std::min(decay_, (1.0 + updates_) / (10.0 + updates_));
  for (auto& [name, s] : shadow_) s.lerp_(params.at(name).detach().to(at::kFloat), 1 - d);
  ++updates_;
}

}  // namespace vidit
