// UniPC multistep sampling for flow-matching velocity models: the sampler Wan 2.1 ships with
// (diffusers' UniPCMultistepScheduler with prediction_type "flow_prediction", use_flow_sigmas,
// flow_shift, solver_order 2, solver_type "bh2", predict_x0, lower_order_final, 1000 training
// timesteps; Wan's own FlowUniPCMultistepScheduler does the same math).
//
// The idea. Along the flow path x_sigma = (1 - sigma) x0 + sigma eps the model's velocity v
// gives a data prediction x0_hat = x - sigma v. Written in lambda = log((1 - sigma) / sigma),
// the exact ODE step from sigma_s to sigma_t is
//   x_t = (sigma_t / sigma_s) x_s + (1 - sigma_t) * integral of e^-(lambda_t - l) x0_hat(l) dl,
// an exponential integrator. UniPC approximates x0_hat(l) by a polynomial through the last
// `order` predictions (the "predictor", UniP, with the B(h) = e^h - 1 weighting: "bh2"); once the
// model has been evaluated at the new point, that fresh prediction refines the same step
// ("corrector", UniC) before the next predictor runs, so each step costs one model evaluation.
// The first steps warm up at lower order (too few past predictions) and the last step drops to
// first order (lower_order_final), which is what lets the last step land on sigma = 0 exactly.
//
// The grid (diffusers, use_flow_sigmas): sigma_i = shift(linspace(1, 1/1000, steps + 1)[i]) for
// i < steps, with shift(s) = k s / (1 + (k - 1) s); the first is nudged to 1 - 1e-6 (so
// lambda stays finite); the final sigma is 0. The model timestep of step i is
// floor(1000 * sigma_i), an integer, computed in float64 before sigmas are rounded to fp32.
//
// Numerics: all of it in fp32, on the sample's device, with the same tensor operations in the
// same order as diffusers 0.42, so an fp32 trajectory equals diffusers' to ~1e-7 (tested in
// unipc_test.cpp against the Python package). A bf16 model output is upcast to fp32 before use
// (diffusers would multiply sigma * v in bf16 there, one bf16 rounding away from this).
#pragma once
#include <ATen/ATen.h>

#include <deque>

#include "diffusion/sampler.h"

namespace vidit {

// The sigma grid UniPC walks, as diffusers computes it (see above): steps + 1 values, fp32, CPU,
// from 1 - 1e-6 down to a final 0.
at::Tensor unipc_sigmas(int64_t steps, double shift);
// The model timesteps of those steps: [steps] int64, CPU, floor(1000 * sigma) in float64.
at::Tensor unipc_timesteps(int64_t steps, double shift);

// The solver's state across the steps of one trajectory (one batch of samples).
// Not thread-safe; one instance per trajectory. Works on any device: the scalar coefficients are
// 0-dim fp32 tensors on the sample's device, as in diffusers (no .item(); the corrector's 2x2
// linear solve at order >= 2 is the one place a CUDA stream may wait, in diffusers too).
class UniPCSolver {
 public:
  struct Options {
    int64_t order = 2;               // UniP / UniC order; Wan: 2 (1..3 supported)
    bool lower_order_final = true;   // last step at first order (needed to land on sigma = 0)
    int64_t num_train_timesteps = 1000;
  };
  UniPCSolver();
  explicit UniPCSolver(Options opt);

  // Builds the grid for `steps` (>= 1) steps at this shift (> 0) and clears the state.
  void set_timesteps(int64_t steps, double shift);

  // One step: `model_output` is the velocity v predicted at sample x = `sample`, sigma =
  // sigmas()[index], timestep timesteps()[index]; returns the sample at sigmas()[index + 1],
  // in sample's dtype, on its device. Shapes: sample and model_output alike, [B, ...] (any
  // rank). Steps are taken in order 0, 1, ..., steps-1; index 0 starts a new trajectory (clears
  // the history), any other index must be the one after the previous call's, else vidit::Error.
  at::Tensor step(const at::Tensor& model_output, int64_t index, const at::Tensor& sample);

  const at::Tensor& timesteps() const { return timesteps_; }  // [steps] int64, CPU
  const at::Tensor& sigmas() const { return sigmas_; }        // [steps + 1] fp32, CPU
  int64_t steps() const { return timesteps_.defined() ? timesteps_.size(0) : 0; }
  const Options& options() const { return opt_; }

 private:
  struct Coefficients;
  Coefficients coefficients(int64_t t, int64_t s0, int64_t order) const;
  at::Tensor sigma_at(int64_t i) const { return sigmas_dev_[i]; }
  at::Tensor lambda_at(int64_t i) const;

  Options opt_;
  at::Tensor sigmas_, timesteps_;
  at::Tensor sigmas_dev_;              // sigmas_ on the device of the samples being stepped
  std::deque<at::Tensor> x0_history_;  // x0 predictions of the last `order` steps, newest last
  at::Tensor last_sample_;             // the sample the last predictor started from
  int64_t next_index_ = 0;
  int64_t warm_ = 0;        // past predictions available (diffusers' lower_order_nums)
  int64_t last_order_ = 0;  // order of the last predictor, which the next corrector reuses
};

struct UniPCOptions {
  int64_t steps = 50;      // Wan: 50
  double shift = 3.0;      // Wan 2.1: 3.0 at 480p, 5.0 at 720p
  double cfg_scale = 5.0;  // 1: no guidance (one model call per step)
  int64_t order = 2;
};

// Integrates from x1 (the starting noise [B, ...], any device, any float dtype) to sigma = 0 with
// UniPC and classifier-free guidance v = v_neg + cfg * (v_text - v_neg); the field is called once
// per step with batch 2B (rows [x; x], text rows [text; negative_text]) when guided, with batch B
// otherwise, at the integer timesteps of unipc_timesteps() given as a float tensor [B] (or [2B]).
// text [B, Lt, D]; negative_text [Lt, D], [1, Lt, D] or [B, Lt, D]. The latents are kept in fp32
// between steps (like diffusers' Wan pipeline); the result has x1's dtype.
at::Tensor unipc_sample(const VelocityField& field, const at::Tensor& x1, const at::Tensor& text,
                        const at::Tensor& negative_text, const UniPCOptions& opt);

}  // namespace vidit
