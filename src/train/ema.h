// Exponential moving average of the weights, kept in fp32 beside the model:
//   ema = d * ema + (1 - d) * param, with d = min(decay, (1 + n) / (10 + n)) at update n,
// so the average tracks the weights closely early in a run and settles to `decay`.
#pragma once
#include "core/safetensors.h"

namespace vidit {

class EMA {
 public:
  EMA(const TensorMap& params, double decay);
  void update(const TensorMap& params);  // same names as at construction
  const TensorMap& weights() const { return shadow_; }
  TensorMap& weights() { return shadow_; }
  int64_t updates() const { return updates_; }
  void set_updates(int64_t n) { updates_ = n; }

 private:
  TensorMap shadow_;
  double decay_;
  int64_t updates_ = 0;
};

}  // namespace vidit
