// One optimizer step, top to bottom: learning rate -> micro-batches (data, flow-matching
// noising, caption dropout, forward under autocast, loss, backward) -> clip -> AdamW -> EMA.
#include <chrono>

#include "diffusion/flow_matching.h"
#include "train/precision.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace vidit {

StepResult Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& tc = cfg_.train;
  const double lr = learning_rate(step_, tc.steps, tc.lr, tc.warmup_steps, tc.schedule, tc.min_lr_ratio);

  for (auto& p : param_list_) p.mutable_grad() = at::Tensor();
  double loss_sum = 0;
  for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
    // Data: clean latents x0 and text embeddings for this micro-batch.
    auto [x0, text] = data_->batch(sampler_.next(tc.batch_size));
    // Flow matching: sigma per sample, x_t = (1 - sigma) x0 + sigma eps, target eps - x0.
    at::Tensor sigma = sample_sigmas(tc.batch_size, cfg_.diffusion, gen_);
    at::Tensor noise = at::randn(x0.sizes(), gen_, at::kFloat);
    text = drop_text(text, null_text_, cfg_.diffusion.text_drop_prob, gen_);
    FlowSample fs = make_flow_sample(x0.to(device_), noise.to(device_), sigma.to(device_));

    at::Tensor pred;
    {
      AutocastGuard autocast(tc.precision, device_.type());
      pred = model_->forward(fs.x_t, fs.timestep, text.to(device_));
    }
    at::Tensor loss = flow_loss(pred, fs.target) / double(tc.grad_accum);
    loss.backward();
    loss_sum += loss.item<double>();
  }

  const double grad_norm = clip_grad_norm(param_list_, tc.grad_clip);
  opt_->step(lr);
  if (ema_) ema_->update(params_);
  ++step_;

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {step_, loss_sum, grad_norm, lr, secs};
}

}  // namespace vidit
