// Where the trainer's micro-batches come from, and the position it saves in checkpoints.
//
// Two kinds: EpochBatchSource (a Dataset of one fixed shape read through an EpochSampler: the
// demo's in-memory clips, synthetic latents) and CacheLoader (cache_loader.h: the latent cache
// through the token-budget bucket sampler, prefetched on background threads). The position is
// three integers (seed, epoch, position) in either case, stored in checkpoint metadata.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "loader/dataset.h"
#include "loader/epoch_sampler.h"

namespace vidit {

struct MicroBatch {
  at::Tensor latents;     // [B, C, T, H, W] clean latents, or the posterior mean when latent_std is set
                          // (B may be 0 for an idle rank)
  at::Tensor latent_std;  // undefined, or [B, C, T, H, W]: the trainer draws latents + std * noise
  at::Tensor texts;       // [B, Lt, D] fp32
  // Data parallel: this batch is rows [row_offset, row_offset + B) of a global batch of
  // global_rows samples spread over the ranks (0: the batch is this rank's own). The trainer draws
  // the global batch's noise and timesteps and keeps its rows, so every sample gets the random
  // numbers it would get in a single-process run.
  int64_t global_rows = 0;
  int64_t row_offset = 0;
  // Who each row is, for blame when a step goes wrong (diagnose/forensics.h): a JSON object,
  // {"index": i} for a dataset, {"key", "source", "start", "end", "bucket"} for the cache.
  std::vector<std::string> ids;
  // Image-to-video (model.condition): [B, 4 + C, T, H, W], the given frames' mask and latent the
  // DiT takes beside the noisy latent (diffusion/frame_condition.h), and [B, tokens, D], the
  // frames' CLIP features (model.image_dim > 0); undefined for text-to-video.
  at::Tensor condition, image;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next micro-batch; `batch_size` is a hint that token-budget sources ignore.
  virtual MicroBatch next(int64_t batch_size) = 0;
  virtual SamplerState state() const = 0;
  virtual void set_state(const SamplerState& s) = 0;
  // True when every data-parallel rank's batches are slices of one global batch (global_rows set);
  // otherwise each rank's batches are its own and it needs its own random stream.
  virtual bool slices_global_batch() const { return false; }
  // Samples never to hand out again, by key (diagnose/quarantine.h: the cache key, or
  // index_key(i) for a dataset's sample i); every rank is given the same set at the same step.
  virtual void skip(std::set<std::string> keys) { skip_ = std::move(keys); }

 protected:
  std::set<std::string> skip_;
};

inline std::string index_key(int64_t i) { return "index " + std::to_string(i); }

// Data parallel: every rank draws the same global batch of `batch_size` indices and loads only
// its slice (rank `rank` of `ranks`, batch_size / ranks samples each).
class EpochBatchSource : public BatchSource {
 public:
  EpochBatchSource(std::shared_ptr<const Dataset> data, uint64_t seed, int rank = 0, int ranks = 1)
      : data_(std::move(data)), sampler_(data_->size(), seed), rank_(rank), ranks_(ranks) {}
  MicroBatch next(int64_t batch_size) override {
    VIDIT_CHECK(batch_size % ranks_ == 0, "train.batch_size (", batch_size,
                ") is the global batch and must be divisible by the data-parallel degree ",
                "parallel.replicate x parallel.shard = ", ranks_);
    const int64_t per_rank = batch_size / ranks_;
    std::vector<int64_t> all = sampler_.next(batch_size);
    // A skipped (quarantined) sample is replaced by the sampler's next one, the same on every
    // rank, so the global batch stays whole.
    for (int64_t& i : all)
      for (int64_t tries = 0; !skip_.empty() && skip_.count(index_key(i)); ++tries) {
        VIDIT_CHECK(tries < data_->size(), "every sample of the dataset is quarantined (", skip_.size(),
                    " keys); remove <out_dir>/quarantine.json or fix the data");
        i = sampler_.next(1)[0];
      }
    std::vector<int64_t> mine(all.begin() + rank_ * per_rank, all.begin() + (rank_ + 1) * per_rank);
    auto [x, t] = data_->batch(mine);
    MicroBatch b{x, at::Tensor(), t, batch_size, rank_ * per_rank, {}, {}, {}};
    for (int64_t i : mine) b.ids.push_back("{\"index\":" + std::to_string(i) + "}");
    return b;
  }
  SamplerState state() const override { return sampler_.state(); }
  void set_state(const SamplerState& s) override { sampler_.set_state(s); }
  bool slices_global_batch() const override { return true; }

 private:
  std::shared_ptr<const Dataset> data_;
  EpochSampler sampler_;
  int rank_, ranks_;
};

}  // namespace vidit
