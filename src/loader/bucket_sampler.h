// Token-budget batches over bucketed samples, split across data-parallel ranks.
//
// Each epoch, from (seed, epoch): the samples of every bucket are shuffled and cut into batches
// of floor(token_budget / tokens-per-sample) samples (at least one), so every batch costs about
// the same whatever its bucket; then the order of all batches is shuffled. Concatenated, the
// batches give the epoch's canonical sample order. A training step takes the next `world`
// batches: rank r gets the r-th. When the batch count is not a multiple of `world`, the largest
// batches are cut into contiguous pieces until it is (the canonical order is unchanged), and
// only when every batch is a single sample do some ranks get an empty batch in the last step.
// Nothing is dropped and nothing repeats within an epoch.
//
// The state is (seed, epoch, samples consumed in the canonical order). Because the canonical
// order does not depend on the number of ranks, a run resumed with a different world size
// continues from the same point: the rest of the epoch is re-batched for the new world.
#pragma once
#include <cstdint>
#include <vector>

namespace vidit {

struct BucketSamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t consumed = 0;  // samples of this epoch's canonical order already trained on (all ranks)
};

class BucketBatchSampler {
 public:
  // bucket_of[i]: bucket index of sample i; tokens_of_bucket[b]: tokens of one sample of bucket b.
  BucketBatchSampler(std::vector<int> bucket_of, std::vector<int64_t> tokens_of_bucket,
                     int64_t token_budget, uint64_t seed, int rank = 0, int world = 1);

  // This rank's next batch (sample indices, all of one bucket; empty only as described above).
  // Every rank calls it once per step; the epoch advances when its batches run out.
  std::vector<int64_t> next();

  BucketSamplerState state() const { return state_; }
  // Continues from a state saved by any rank of a run at any world size.
  void set_state(const BucketSamplerState& s);

  // Steps left in the current epoch for this world size.
  int64_t steps_left_in_epoch() const { return int64_t(plan_.size()) / world_ - step_; }
  // The whole epoch's canonical order for (seed, epoch): for tests and tools.
  std::vector<std::vector<int64_t>> epoch_batches(int64_t epoch) const;
  int bucket_of(int64_t sample) const { return bucket_of_[size_t(sample)]; }

 private:
  void build_plan();
  std::vector<int> bucket_of_;
  std::vector<int64_t> tokens_;
  int64_t budget_;
  int rank_, world_;
  BucketSamplerState state_;
  std::vector<std::vector<int64_t>> plan_;  // batches of the rest of the epoch, dealt step-major
  int64_t step_ = 0;                        // steps taken from plan_
};

}  // namespace vidit
