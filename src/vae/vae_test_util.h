// What the VAE tests share: the Wan 2.1 VAE's structure at a width that runs in milliseconds,
// and random weights that carry signal through every path.
#pragma once
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>

#include "vae/wan_vae.h"

namespace vidit::test {

// The Wan 2.1 structure (4 stages, 2 residual blocks, time halved in the last two downsamplings,
// 16 latent channels) at base width 8; tests/reference/diffusers_vae_reference.py builds the same.
inline WanVAEConfig tiny_vae_config() {
  WanVAEConfig c;
  c.base_dim = 8;
  return c;
}

// Random weights everywhere, also where the official init puts zeros (attention proj) or ones
// (norm gammas), so every path carries signal. Weights ~ N(0, 1/fan_in) keep activations O(1).
inline void randomize_parameters(torch::nn::Module& module) {
  at::NoGradGuard ng;
  for (auto& item : module.named_parameters()) {
    at::Tensor p = item.value();
    if (item.key().ends_with("gamma")) {
      p.normal_(1.0, 0.2);
    } else if (p.dim() > 1) {
      p.normal_(0.0, 1.0 / std::sqrt(double(p.numel() / p.size(0))));
    } else {
      p.normal_(0.0, 0.1);
    }
  }
}

inline WanVAE random_vae(const WanVAEConfig& cfg, uint64_t seed) {
  torch::manual_seed(seed);
  WanVAE vae(cfg);
  randomize_parameters(*vae);
  return vae;
}

// The VAE tests' tensors are tiny: extra threads only add overhead (and on a loaded 2-core machine
// spin-waiting costs 10x), so each test runs single-threaded and restores the setting after.
class OneThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    at::set_num_threads(1);
  }
  void TearDown() override { at::set_num_threads(threads_); }

 private:
  int threads_ = 1;
};

}  // namespace vidit::test
