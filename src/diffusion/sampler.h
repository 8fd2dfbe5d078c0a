// Euler sampler for the flow-matching ODE dx/dsigma = v(x, sigma), integrated from sigma = 1
// (pure noise) to sigma = 0, with classifier-free guidance v = v_null + cfg * (v_text - v_null).
// Deterministic for a seed. Two sigma grids:
//  - EulerGrid::linear (the default, used by the demo): sigma_i = shift(1 - i/steps), i = 0..steps,
//    in float64; the model timestep is sigma * 1000.
//  - EulerGrid::diffusers: diffusers' FlowMatchEulerDiscreteScheduler(shift) grid, which is what a
//    diffusers pipeline with that scheduler walks: steps sigmas from 1 to shift(shift(1/1000))
//    (diffusers applies its shift once to its training grid and once more at set_timesteps, so
//    the last nonzero sigma is shifted twice), then a final 0; fp32; the model timestep is
//    sigma * 1000 in fp32; each step is x + (sigma_next - sigma) * v with the difference in fp32.
// Which one Wan sampling uses: `sample.solver = "euler"` (sample_latents below) walks the
// diffusers grid, so a vidit Euler sample and a diffusers Euler sample of the same weights, noise
// and shift are the same trajectory; "unipc" (unipc.h, Wan's default) follows diffusers'
// UniPCMultistepScheduler. The demo calls euler_sample with the default linear grid, unchanged.
#pragma once
#include <ATen/ATen.h>

#include <functional>

#include "core/config.h"

namespace vidit {

// v = field(x, timestep [B] = sigma*1000, text [B, Lt, D])
using VelocityField = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

enum class EulerGrid {
  linear,     // shift(linspace(1, 0, steps + 1)) in float64 (vidit's own; the demo's)
  diffusers,  // FlowMatchEulerDiscreteScheduler's set_timesteps grid (see above)
};

struct EulerOptions {
  int64_t steps = 30;
  double shift = 1.0;
  double cfg_scale = 1.0;  // 1: no guidance (one model call per step)
  EulerGrid grid = EulerGrid::linear;
};

// Integrates from x1 (the starting noise, [B, ...]) to sigma = 0; the result has x1's dtype.
// null_text: [Lt, D], [1, Lt, D] or [B, Lt, D].
at::Tensor euler_sample(const VelocityField& field, at::Tensor x1, const at::Tensor& text,
                        const at::Tensor& null_text, const EulerOptions& opt);

// The sigma grid used by euler_sample with EulerGrid::linear: steps+1 values from 1 down to 0,
// float64, CPU.
at::Tensor euler_sigmas(int64_t steps, double shift);

// diffusers' FlowMatchEulerDiscreteScheduler(num_train_timesteps = 1000, shift).set_timesteps(steps)
// sigmas: steps + 1 values, fp32, CPU, from 1 down to a final 0. Its timesteps are the first
// `steps` of them times 1000, in fp32 (flow_euler_timesteps_diffusers).
at::Tensor flow_euler_sigmas_diffusers(int64_t steps, double shift);
at::Tensor flow_euler_timesteps_diffusers(int64_t steps, double shift);

// One guided velocity: the field at (x [B, ...], t [B]) with `text` [B, Lt, D], and when
// cfg_scale != 1 also with `negative_text` (any shape expand_text accepts), the two in one call of
// batch 2B; returns v_neg + cfg * (v_text - v_neg) in fp32 (v_text alone when cfg_scale == 1).
at::Tensor guided_velocity(const VelocityField& field, const at::Tensor& x, const at::Tensor& t,
                           const at::Tensor& text, const at::Tensor& negative_text, double cfg_scale);

// negative / null text [Lt, D], [1, Lt, D] or [B, Lt, D] as [B, Lt, D] like `text`
// (its dtype and device). Throws vidit::Error when the shapes cannot match.
at::Tensor expand_text(const at::Tensor& negative_text, const at::Tensor& text);

// Wan sampling as the config asks (sample.solver, steps, shift, cfg_scale): "unipc" runs
// unipc_sample (order 2), "euler" runs euler_sample on EulerGrid::diffusers. x1 [B, ...] noise;
// text [B, Lt, D]; negative_text as in expand_text. The result has x1's dtype.
at::Tensor sample_latents(const VelocityField& field, const at::Tensor& x1, const at::Tensor& text,
                          const at::Tensor& negative_text, const SampleConfig& cfg);

}  // namespace vidit
