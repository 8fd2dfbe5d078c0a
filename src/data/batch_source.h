// Where the trainer's micro-batches come from, and the position it saves in checkpoints.
//
// Two kinds: EpochBatchSource (a Dataset of one fixed shape read through an EpochSampler: the
// demo's in-memory clips, synthetic latents) and CacheLoader (cache_loader.h: the latent cache
// through the token-budget bucket sampler, prefetched on background threads). The position is
// three integers (seed, epoch, position) in either case, stored in checkpoint metadata.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "data/dataset.h"
#include "data/epoch_sampler.h"

namespace vidit {

struct MicroBatch {
  at::Tensor latents;     // [B, C, T, H, W] clean latents, or the posterior mean when latent_std is set
                          // (B may be 0 for an idle rank)
  at::Tensor latent_std;  // undefined, or [B, C, T, H, W]: the trainer draws latents + std * noise
  at::Tensor texts;       // [B, Lt, D] fp32
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next micro-batch; `batch_size` is a hint that token-budget sources ignore.
  virtual MicroBatch next(int64_t batch_size) = 0;
  virtual SamplerState state() const = 0;
  virtual void set_state(const SamplerState& s) = 0;
};

class EpochBatchSource : public BatchSource {
 public:
  EpochBatchSource(std::shared_ptr<const Dataset> data, uint64_t seed)
      : data_(std::move(data)), sampler_(data_->size(), seed) {}
  MicroBatch next(int64_t batch_size) override {
    auto [x, t] = data_->batch(sampler_.next(batch_size));
    return {x, at::Tensor(), t};
  }
  SamplerState state() const override { return sampler_.state(); }
  void set_state(const SamplerState& s) override { sampler_.set_state(s); }

 private:
  std::shared_ptr<const Dataset> data_;
  EpochSampler sampler_;
};

}  // namespace vidit
