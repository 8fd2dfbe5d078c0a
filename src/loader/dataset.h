// Training samples: a latent clip and its text embedding. A Dataset is an indexable source;
// the trainer batches it through an EpochSampler (epoch_sampler.h).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"

namespace vidit {

struct Sample {
  at::Tensor latent;  // [C, T, H, W] fp32
  at::Tensor text;    // [Lt, text_dim] fp32
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;
  // Stacks samples into latents [B, C, T, H, W] and texts [B, Lt, D].
  std::pair<at::Tensor, at::Tensor> batch(const std::vector<int64_t>& indices) const;
};

// Random latents and texts, a pure function of (seed, index): for benchmarks and for smoke
// runs of large presets without data.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(const Config& cfg, int64_t size, uint64_t seed);
  int64_t size() const override { return size_; }
  Sample get(int64_t i) const override;

 private:
  std::vector<int64_t> latent_shape_, text_shape_;
  int64_t size_;
  uint64_t seed_;
};

}  // namespace vidit
