// Flow matching, Wan's convention. For clean latents x0 and noise eps ~ N(0, I):
//   x_t = (1 - sigma) * x0 + sigma * eps,   target v = eps - x0,   model timestep = sigma * 1000.
// sigma is drawn uniform(0,1) or logit-normal(m, s) = sigmoid(N(m, s)), then shifted:
//   sigma' = s*sigma / (1 + (s - 1)*sigma)   (s > 1 spends more steps at high noise).
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "core/config.h"

namespace vidit {

at::Tensor shift_sigma(const at::Tensor& sigma, double shift);

// B sigmas in (0, 1) per the config's distribution and shift, drawn from `gen`.
at::Tensor sample_sigmas(int64_t B, const DiffusionConfig& cfg, at::Generator& gen);

// The noise levels one expert of a two-expert model serves (model/experts.h): [boundary, 1) for
// the high-noise expert, [0, boundary) for the low-noise one, [0, 1) for a one-model run.
struct SigmaRange {
  double lo = 0, hi = 1;
};
SigmaRange sigma_range(Expert expert, double boundary);
// The same distribution cut to `range` (sigma after the shift, as the sampler's timesteps):
// exactly the conditional distribution, drawn by its inverse CDF from one uniform number per
// sample (the shift and the sigmoid are monotone, so the cut maps to a cut of the uniform or
// normal draw). The whole range [0, 1) draws as sample_sigmas does, the same numbers.
at::Tensor sample_sigmas(int64_t B, const DiffusionConfig& cfg, at::Generator& gen, SigmaRange range);

struct FlowSample {
  at::Tensor x_t;       // noisy latents, like x0
  at::Tensor target;    // eps - x0
  at::Tensor timestep;  // [B] sigma * 1000
};

// Builds the training input and target from x0 [B, ...], noise like x0 and sigma [B].
FlowSample make_flow_sample(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& sigma);

// Mean squared error between the predicted and target velocity (fp32).
at::Tensor flow_loss(const at::Tensor& pred, const at::Tensor& target);
// Each of the first `rows` samples' own loss (its mean squared error, fp32, no gradient), on the
// host: what the spike detector judges (diagnose/spike_detector.h).
std::vector<double> sample_losses(const at::Tensor& pred, const at::Tensor& target, int64_t rows);

// Replaces each sample's text with `null_text` with probability p (classifier-free guidance
// training). text [B, Lt, D]; null_text [Lt, D] or [1, Lt, D].
at::Tensor drop_text(const at::Tensor& text, const at::Tensor& null_text, double p, at::Generator& gen);
// The same in two parts: which of B samples keep their caption ([B] bool, true with probability
// 1 - p; the draws drop_text makes), and the replacement given that mask.
at::Tensor sample_text_keep(int64_t B, double p, at::Generator& gen);
at::Tensor drop_text(const at::Tensor& text, const at::Tensor& null_text, const at::Tensor& keep);

}  // namespace vidit
