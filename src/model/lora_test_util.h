// What the LoRA tests share (model/lora.h's, and those of LoRA runs): a model's inputs for the
// tiny config, a freshly initialised model with a little noise on every weight, and a copy of a
// model's weights. Test-only.
#pragma once
#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cstdint>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/dit.h"
#include "model/state_dict.h"

namespace vidit::lora_test {

struct Inputs {
  at::Tensor x, t, text;
};
inline Inputs inputs(const Config& c) {
  at::manual_seed(3);
  return {at::randn({2, c.model.in_channels, c.data.latent_frames, c.data.latent_height, c.data.latent_width}),
          at::tensor({0.3, 0.8}, at::kFloat) * 1000, at::randn({2, c.model.text_len, c.model.text_dim})};
}

inline DiT fresh_model(const Config& c, uint64_t seed = 5) {
  torch::manual_seed(seed);
  DiT m(c.model);
  m->init_weights();
  // init_weights() zeroes the head (the model starts by predicting 0); a little noise everywhere
  // makes every projection matter to the output.
  at::NoGradGuard ng;
  for (auto& p : m->parameters()) p.add_(at::randn_like(p) * 0.02);
  return m;
}

inline TensorMap copy_of(DiT& model) {
  TensorMap out;
  for (const auto& [k, v] : state_dict(*model)) out[k] = v.clone();
  return out;
}

}  // namespace vidit::lora_test
