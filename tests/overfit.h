// One fixed batch (latents, noise, sigmas, text) trained with the model, the flow-matching loss,
// clipping and AdamW of the trainer: the losses step by step. With `precision` fp8 or
// fp8_rowwise the blocks' projections multiply in FP8 (model/fp8.h), under its autocast.
#pragma once
#include <vector>

#include "core/precision.h"
#include "diffusion/flow_matching.h"
#include "loader/dataset.h"
#include "model/dit.h"
#include "model/fp8.h"
#include "model/state_dict.h"
#include "train/adamw.h"

namespace vidit::test {

inline std::vector<double> overfit_one_batch(const Config& c, Precision precision, int steps) {
  torch::manual_seed(0);
  DiT model(c.model);
  model->init_weights();
  apply_fp8(*model, precision);
  auto params = state_dict(*model);
  for (auto& item : model->named_parameters()) params[item.key()] = item.value();
  AdamW opt(params, {0.9, 0.99, 1e-8, 0.0});
  auto [x0, text] = SyntheticDataset(c, 2, 5).batch({0, 1});
  FlowSample fs = make_flow_sample(x0, at::randn(x0.sizes()), at::tensor({0.3f, 0.7f}));
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    model->zero_grad();
    at::Tensor loss;
    {
      AutocastGuard autocast(precision, at::kCPU);
      loss = flow_loss(model->forward(fs.x_t, fs.timestep, text), fs.target);
    }
    loss.backward();
    clip_grad_norm(model->parameters(), 1.0);
    opt.step(3e-3);
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace vidit::test
