// Training batches from the latent cache.
//
// The bucket sampler (bucket_sampler.h) decides each step's sample indices for this rank; loader
// threads read those samples from the memory-mapped shards, verify their checksums, pad text to
// model.text_len, stack mean and std (in the cache's storage type, bf16 by default, so half the
// bytes travel) and copy into pinned memory when a GPU is present. The trainer draws the latent
// by reparameterisation, mean + std * noise, with its own checkpointed generator (so a resumed
// run draws the same latents). Up to data.prefetch batches are prepared ahead by
// data.loader_threads threads; next() hands them out in order.
//
// With data.balance = "cost" the batches are sized by predicted compute (cost_model.h) instead of
// tokens, the budget being the cost of data.token_budget tokens of the data.latent_* shape, then
// lowered by balanced_budget() so buckets' batches come out near-equal (bucket_sampler.h). A batch
// of short samples then holds more tokens than token_budget (their cost per token is lower):
// activation memory grows with tokens, so take the shortest bucket as the reference shape when
// memory is tight.
//
// Clips held out for validation (data.val_fraction; loader/validation_split.h) never train.
//
// A sample that fails its checksum or cannot be read is skipped (the batch is one smaller) and
// recorded in skipped() and on stderr; training never stops for it. Samples named by skip()
// (quarantined) are dropped from the batches as they are handed out. The saved position is that
// of the batches handed out, not of those prefetched, so a checkpoint resumes exactly.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "loader/batch_source.h"
#include "loader/bucket_sampler.h"
#include "loader/cost_model.h"
#include "loader/buckets.h"
#include "loader/latent_cache.h"

namespace vidit {

// The samples `indices` of `cache` as one micro-batch (unpinned): latent mean and std, the text
// padded to model.text_len, and image-to-video's condition and image features. A sample that
// cannot be read or does not fit the model is left out, its message handed to `skipped`.
MicroBatch read_cache_batch(const LatentCache& cache, const std::vector<int64_t>& indices, const ModelConfig& m,
                            const std::function<void(const std::string&)>& skipped);

class CacheLoader : public BatchSource {
 public:
  // `pin`: pinned host memory. `costs`: with data.balance = "cost", the cost model that sizes the
  // batches (e.g. one refitted to measured step times: cost_model.h); default cost_model_for(cfg).
  CacheLoader(std::shared_ptr<const LatentCache> cache, const Config& cfg, int rank = 0, int world = 1,
              bool pin = false, std::optional<CostModel> costs = std::nullopt);
  ~CacheLoader() override;

  MicroBatch next(int64_t batch_size_hint = 0) override;
  SamplerState state() const override;
  void set_state(const SamplerState& s) override;

  const std::vector<std::string>& bucket_names() const { return bucket_names_; }
  std::vector<std::string> skipped() const;
  int64_t token_budget() const { return budget_; }
  // One line: data.balance, the budget, and each bucket's samples per full batch ("name xN").
  std::string plan() const;

 private:
  struct Job {
    int64_t seq;
    std::vector<int64_t> indices;
  };
  void start();
  void stop();
  void work();
  MicroBatch assemble(const Job& job);
  MicroBatch without_skipped(MicroBatch b) const;  // drops the rows skip() names

  std::shared_ptr<const LatentCache> cache_;
  Config cfg_;
  bool pin_;
  int64_t budget_ = 0;
  BalancedBudget balanced_;  // data.balance = "cost" only
  std::string cost_unit_;  // of the cost model sizing the batches
  std::vector<std::string> bucket_names_;
  // The cache indices this loader draws from: all but the validation split's (validation_split.h);
  // the sampler's indices are positions in it.
  std::vector<int64_t> members_;
  std::unique_ptr<BucketBatchSampler> sampler_;
  BucketSamplerState handed_;  // position after the last batch handed out

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  int64_t next_seq_ = 0;   // next job to create
  int64_t want_seq_ = 0;   // next batch next() returns
  std::map<int64_t, MicroBatch> ready_;
  std::map<int64_t, BucketSamplerState> after_;  // sampler state after each job
  std::vector<std::string> skipped_;
};

}  // namespace vidit
