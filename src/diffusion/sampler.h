// Euler sampler for the flow-matching ODE dx/dsigma = v(x, sigma), integrated from sigma = 1
// (pure noise) to sigma = 0 on the shifted grid sigma_i = shift(1 - i/steps), with
// classifier-free guidance v = v_null + cfg * (v_text - v_null). Deterministic for a seed.
#pragma once
#include <ATen/ATen.h>

#include <functional>

namespace vidit {

// v = field(x, timestep [B] = sigma*1000, text [B, Lt, D])
using VelocityField = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

struct EulerOptions {
  int64_t steps = 30;
  double shift = 1.0;
  double cfg_scale = 1.0;  // 1: no guidance (one model call per step)
};

// Integrates from x1 (the starting noise, [B, ...]) to sigma = 0.
at::Tensor euler_sample(const VelocityField& field, at::Tensor x1, const at::Tensor& text,
                        const at::Tensor& null_text, const EulerOptions& opt);

// The sigma grid used by euler_sample: steps+1 values from 1 down to 0.
at::Tensor euler_sigmas(int64_t steps, double shift);

}  // namespace vidit
