// Cost-budget batches over bucketed samples, split across data-parallel ranks.
//
// Every bucket b has a cost per sample c_b, in any unit: its tokens (data.balance = "tokens") or
// its predicted compute (data.balance = "cost": cost_model.h, attention's share growing with
// tokens squared). Each epoch, from (seed, epoch): the samples of every bucket are shuffled and
// cut into batches of floor(budget / c_b) samples (at least one), so every batch costs about the
// same whatever its bucket; then the order of all batches is shuffled. Concatenated, the batches
// give the epoch's canonical sample order. A training step takes the next `world` batches: rank r
// gets the r-th. When the batch count is not a multiple of `world`, the costliest batches are cut
// into contiguous pieces until it is (the canonical order is unchanged), and only when every batch
// is a single sample do some ranks get an empty batch in the last step. Nothing is dropped and
// nothing repeats within an epoch.
//
// What is left unequal: a full batch of bucket b costs floor(budget / c_b) * c_b, up to one
// sample's cost under the budget (half of it when a sample costs just over half the budget), and a
// step waits for its costliest batch. balanced_budget() chooses the budget, within [budget / 2,
// budget x 1.05], at which the buckets' full batches are closest to equal in cost (weighted by how
// many batches each bucket makes); data.balance = "cost" uses it, so every batch is predicted to
// cost about the same and ranks wait little. (The 5% above: the cost budget is a target derived
// from a reference shape, and rounding a bucket of few samples per batch up rather than down can
// be what brings it level with the others.) What stays unequal: each bucket's last, partial batch
// of an epoch, and the batches cut into pieces to fill the last step.
//
// The state is (seed, epoch, samples consumed in the canonical order). Because the canonical
// order does not depend on the number of ranks, a run resumed with a different world size
// continues from the same point: the rest of the epoch is re-batched for the new world. (It does
// depend on the costs and the budget: resume with the same data.balance and model.)
#pragma once
#include <cstdint>
#include <vector>

namespace vidit {

struct BucketSamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t consumed = 0;  // samples of this epoch's canonical order already trained on (all ranks)
};

// The budget at which full batches are closest to equal in cost: the candidates are `budget` and
// every k * c_b in [budget / 2, budget x (1 + kBudgetSlack)] (k samples of bucket b fill it
// exactly; buckets of more than 64 samples per batch lose under 2% to rounding and add none); the
// one with the highest efficiency wins, or of those within 0.002 of it the nearest to `budget`
// (the larger on a tie). Efficiency: the
// mean cost of a full batch, each bucket weighted by its batches per epoch (samples_of_bucket[b] /
// batch size), over the costliest one's; 1 when every full batch costs the same.
constexpr double kBudgetSlack = 0.05;
struct BalancedBudget {
  double budget = 0;
  double efficiency = 0;            // at `budget`
  double efficiency_unbalanced = 0;  // at the budget given
};
BalancedBudget balanced_budget(const std::vector<double>& cost_of_bucket, const std::vector<int64_t>& samples_of_bucket,
                               double budget);

class BucketBatchSampler {
 public:
  // bucket_of[i]: bucket index of sample i; cost_of_bucket[b]: cost of one sample of bucket b
  // (> 0); budget: the cost a batch is filled up to, in the same unit (> 0).
  BucketBatchSampler(std::vector<int> bucket_of, std::vector<double> cost_of_bucket, double budget, uint64_t seed,
                     int rank = 0, int world = 1);

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
  // Samples in a full batch of bucket b: max(1, floor(budget / cost_of_bucket[b])).
  int64_t batch_size_of_bucket(int b) const;

 private:
  void build_plan();
  std::vector<int> bucket_of_;
  std::vector<double> cost_;
  double budget_;
  int rank_, world_;
  BucketSamplerState state_;
  std::vector<std::vector<int64_t>> plan_;  // batches of the rest of the epoch, dealt step-major
  int64_t step_ = 0;                        // steps taken from plan_
};

}  // namespace vidit
