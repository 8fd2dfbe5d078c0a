// Learning rate at a step: linear warm-up to the peak, then constant or cosine decay to
// min_lr_ratio * peak at the last step.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "core/config.h"

namespace vidit {

inline double learning_rate(int64_t step, int64_t total_steps, double peak, int64_t warmup,
                            Schedule schedule, double min_ratio) {
  if (step < warmup) return peak * double(step + 1) / double(warmup);
  if (schedule == Schedule::constant) return peak;
  const double span = double(std::max<int64_t>(1, total_steps - warmup));
  const double progress = std::min(1.0, double(step - warmup) / span);
  const double floor = peak * min_ratio;
  return floor + (peak - floor) * 0.5 * (1 + std::cos(M_PI * progress));
}

}  // namespace vidit
