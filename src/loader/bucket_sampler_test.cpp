// The bucket sampler: determinism, one bucket per batch, the budget (tokens or predicted cost),
// disjoint ranks covering every sample once per epoch, resume at the same and another world
// size, and balanced_budget() evening out the ranks' predicted cost per step.
#include "loader/bucket_sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/error.h"
#include "loader/cost_model.h"

namespace vidit {
namespace {

// 103 samples over 3 buckets of 100, 300 and 1000 tokens per sample; budget 1000 tokens.
struct Fixture {
  std::vector<int> bucket_of;
  std::vector<double> tokens{100, 300, 1000};
  Fixture() {
    for (int i = 0; i < 103; ++i) bucket_of.push_back(i % 7 == 0 ? 2 : (i % 3 == 0 ? 1 : 0));
  }
  BucketBatchSampler make(int rank, int world, uint64_t seed = 5) const {
    return BucketBatchSampler(bucket_of, tokens, 1000, seed, rank, world);
  }
};

// Runs every rank in lock step for `steps` steps; returns batches per rank.
std::vector<std::vector<std::vector<int64_t>>> run(std::vector<BucketBatchSampler>& ranks, int64_t steps) {
  std::vector<std::vector<std::vector<int64_t>>> out(ranks.size());
  for (int64_t s = 0; s < steps; ++s)
    for (size_t r = 0; r < ranks.size(); ++r) out[r].push_back(ranks[r].next());
  return out;
}

std::vector<BucketBatchSampler> world_of(const Fixture& f, int world) {
  std::vector<BucketBatchSampler> v;
  for (int r = 0; r < world; ++r) v.push_back(f.make(r, world));
  return v;
}

TEST(BucketSampler, DeterministicAndEpochsDiffer) {
  Fixture f;
  auto a = f.make(0, 1), b = f.make(0, 1), c = f.make(0, 1, /*seed=*/6);
  std::vector<std::vector<int64_t>> xa, xb, xc;
  for (int i = 0; i < 40; ++i) xa.push_back(a.next()), xb.push_back(b.next()), xc.push_back(c.next());
  EXPECT_EQ(xa, xb);
  EXPECT_NE(xa, xc);
  EXPECT_NE(a.epoch_batches(0), a.epoch_batches(1));
}

TEST(BucketSampler, OneBucketPerBatchWithinTheBudget) {
  Fixture f;
  auto s = f.make(0, 1);
  std::map<int, size_t> full;  // bucket -> size of a full batch
  for (const auto& batch : s.epoch_batches(0)) {
    ASSERT_FALSE(batch.empty());
    const int b = f.bucket_of[size_t(batch[0])];
    for (int64_t i : batch) EXPECT_EQ(f.bucket_of[size_t(i)], b);
    EXPECT_LE(double(batch.size()) * f.tokens[size_t(b)], 1000);
    full[b] = std::max(full[b], batch.size());
  }
  EXPECT_EQ(full[0], 10u);  // 1000 / 100
  EXPECT_EQ(full[1], 3u);   // 1000 / 300
  EXPECT_EQ(full[2], 1u);   // 1000 / 1000
}

TEST(BucketSampler, RanksAreDisjointAndCoverTheEpoch) {
  Fixture f;
  for (int world : {1, 2, 3, 4, 7}) {
    auto ranks = world_of(f, world);
    const int64_t steps = ranks[0].steps_left_in_epoch();
    for (auto& r : ranks) EXPECT_EQ(r.steps_left_in_epoch(), steps) << "world " << world;
    auto out = run(ranks, steps);
    std::multiset<int64_t> seen;
    for (const auto& rank : out)
      for (const auto& batch : rank) seen.insert(batch.begin(), batch.end());
    EXPECT_EQ(seen.size(), f.bucket_of.size()) << "world " << world;
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), f.bucket_of.size()) << "world " << world;
    EXPECT_EQ(ranks[0].state().epoch, 0);
    ranks[0].next();
    EXPECT_EQ(ranks[0].state().epoch, 1) << "world " << world;
  }
}

TEST(BucketSampler, ResumeAtTheSameWorldContinuesExactly) {
  Fixture f;
  auto full = world_of(f, 2);
  auto expect = run(full, 50);  // crosses an epoch boundary
  auto first = world_of(f, 2);
  auto a = run(first, 17);
  const BucketSamplerState saved = first[1].state();
  auto second = world_of(f, 2);
  for (auto& r : second) r.set_state(saved);
  auto b = run(second, 33);
  for (int r = 0; r < 2; ++r) {
    a[size_t(r)].insert(a[size_t(r)].end(), b[size_t(r)].begin(), b[size_t(r)].end());
    EXPECT_EQ(a[size_t(r)], expect[size_t(r)]) << "rank " << r;
  }
}

TEST(BucketSampler, ResumeAtAnotherWorldNeitherRepeatsNorSkips) {
  Fixture f;
  for (auto [w1, w2] : {std::pair{4, 3}, std::pair{2, 5}, std::pair{3, 1}}) {
    auto first = world_of(f, w1);
    auto a = run(first, 4);
    const BucketSamplerState saved = first[0].state();
    EXPECT_EQ(saved.epoch, 0);
    std::multiset<int64_t> seen;
    for (const auto& rank : a)
      for (const auto& batch : rank) seen.insert(batch.begin(), batch.end());
    EXPECT_EQ(int64_t(seen.size()), saved.consumed);
    std::vector<BucketBatchSampler> second;
    for (int r = 0; r < w2; ++r) {
      second.push_back(f.make(r, w2));
      second.back().set_state(saved);
    }
    auto b = run(second, second[0].steps_left_in_epoch());
    for (const auto& rank : b)
      for (const auto& batch : rank) seen.insert(batch.begin(), batch.end());
    EXPECT_EQ(seen.size(), f.bucket_of.size()) << w1 << " -> " << w2;
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), f.bucket_of.size()) << w1 << " -> " << w2;
  }
}

TEST(BucketSampler, SingleSampleBatchesPadWithEmptyOnlyAtTheEnd) {
  // 5 samples of a bucket that fills the budget alone, 2 ranks: 3 steps, one empty batch last.
  BucketBatchSampler r0({0, 0, 0, 0, 0}, {1000}, 1000, 1, 0, 2), r1({0, 0, 0, 0, 0}, {1000}, 1000, 1, 1, 2);
  EXPECT_EQ(r0.steps_left_in_epoch(), 3);
  int empties = 0;
  std::set<int64_t> seen;
  for (int s = 0; s < 3; ++s) {
    auto a = r0.next(), b = r1.next();
    empties += a.empty() + b.empty();
    if (s < 2) {
      EXPECT_FALSE(a.empty() || b.empty());
    }
    seen.insert(a.begin(), a.end());
    seen.insert(b.begin(), b.end());
  }
  EXPECT_EQ(empties, 1);
  EXPECT_EQ(seen.size(), 5u);
}

TEST(BucketSampler, BadInputsAreRefused) {
  EXPECT_THROW(BucketBatchSampler({}, {10}, 100, 0), Error);
  EXPECT_THROW(BucketBatchSampler({0, 1}, {10}, 100, 0), Error);
  EXPECT_THROW(BucketBatchSampler({0}, {10}, 0, 0), Error);
  EXPECT_THROW(BucketBatchSampler({0}, {10}, 100, 0, 2, 2), Error);
  BucketBatchSampler s({0, 0, 0}, {10}, 100, 0);
  EXPECT_THROW(s.set_state({0, 0, 4}), Error);
}

TEST(BucketSampler, CostBudgetSizesBatchesByCost) {
  // Costs per sample 1, 2.5 and 7 against a budget of 10: 10, 4 and 1 samples per batch; a budget
  // that is an exact multiple in floating point (0.1 x 30 = 3) still takes all 30.
  std::vector<int> bucket_of;
  for (int i = 0; i < 60; ++i) bucket_of.push_back(i % 3);
  BucketBatchSampler s(bucket_of, {1, 2.5, 7}, 10, 3);
  EXPECT_EQ(s.batch_size_of_bucket(0), 10);
  EXPECT_EQ(s.batch_size_of_bucket(1), 4);
  EXPECT_EQ(s.batch_size_of_bucket(2), 1);
  std::multiset<int64_t> seen;
  for (const auto& batch : s.epoch_batches(0)) {
    const double per = std::vector<double>{1, 2.5, 7}[size_t(bucket_of[size_t(batch[0])])];
    EXPECT_LE(double(batch.size()) * per, 10.0);
    seen.insert(batch.begin(), batch.end());
  }
  EXPECT_EQ(seen.size(), 60u);
  EXPECT_EQ(BucketBatchSampler({0}, {0.1}, 0.1 * 30, 0).batch_size_of_bucket(0), 30);
}

TEST(BalancedBudget, PicksTheBudgetAtWhichFullBatchesCostTheSame) {
  // Samples of cost 1 fill a budget of 10 exactly, one of cost 6 leaves 40% idle: at 6 both are
  // full (6 samples and 1), so the budget comes down to 6 and the efficiency goes to 1.
  const BalancedBudget b = balanced_budget({1, 6}, {100, 100}, 10);
  EXPECT_DOUBLE_EQ(b.budget, 6);
  EXPECT_DOUBLE_EQ(b.efficiency, 1);
  EXPECT_LT(b.efficiency_unbalanced, 0.7);
  // Already equal: the budget stays. Never below half the budget: a sample of cost 4.5 alone
  // (n = 1 at any budget in [5, 10]) is not worth halving the batches of the others.
  EXPECT_DOUBLE_EQ(balanced_budget({1, 2}, {10, 10}, 10).budget, 10);
  const BalancedBudget h = balanced_budget({1, 4.5}, {100, 100}, 10);
  EXPECT_GE(h.budget, 5);
  EXPECT_DOUBLE_EQ(h.budget, 9);  // two samples of 4.5, nine of 1
  // Up to 5% over: three samples of 3.4 (10.2) sit level with ten of 1, where two (6.8) would not.
  const BalancedBudget up = balanced_budget({1, 3.4}, {100, 100}, 10);
  EXPECT_DOUBLE_EQ(up.budget, 3 * 3.4);
  EXPECT_GT(up.efficiency, 0.98);
  EXPECT_THROW(balanced_budget({1, 0}, {1, 1}, 10), Error);
  EXPECT_THROW(balanced_budget({1}, {1, 1}, 10), Error);
  EXPECT_THROW(balanced_budget({1}, {1}, 0), Error);
}

// Mean over the steps of an epoch of (max / mean - 1) of the ranks' predicted batch cost.
double predicted_imbalance(const std::vector<int>& bucket_of, const std::vector<double>& cost_of_bucket,
                           const std::vector<double>& sampler_cost, double budget, int world) {
  std::vector<BucketBatchSampler> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(bucket_of, sampler_cost, budget, 11, r, world);
  const int64_t steps = ranks[0].steps_left_in_epoch();
  double sum = 0;
  for (int64_t s = 0; s < steps; ++s) {
    double most = 0, total = 0;
    for (auto& r : ranks) {
      const auto batch = r.next();
      const double c = batch.empty() ? 0 : double(batch.size()) * cost_of_bucket[size_t(bucket_of[size_t(batch[0])])];
      most = std::max(most, c), total += c;
    }
    sum += most / (total / world) - 1;
  }
  return sum / double(steps);
}

TEST(BalancedBudget, CostBalanceEvensOutRanksWhereTokenBalanceCannot) {
  // Clips of 32, 256 and 1152 tokens under a model whose attention (per token pair) equals its
  // projections (per token) at 640 tokens; 4 ranks, a budget of 1152 tokens (one long clip).
  CostModel m;
  m.per_token = 1, m.per_token_pair = 1.0 / 640;
  const std::vector<int64_t> tokens{32, 256, 1152};
  std::vector<int> bucket_of;
  for (int i = 0; i < 2400; ++i) bucket_of.push_back(i % 40 == 0 ? 2 : (i % 4 == 0 ? 1 : 0));
  std::vector<double> cost, tok;
  std::vector<int64_t> samples(3, 0);
  for (int b : bucket_of) ++samples[size_t(b)];
  for (int64_t t : tokens) cost.push_back(m.cost(t)), tok.push_back(double(t));
  const double by_tokens = predicted_imbalance(bucket_of, cost, tok, 1152, 4);
  const BalancedBudget bb = balanced_budget(cost, samples, m.cost(1152));
  const double by_cost = predicted_imbalance(bucket_of, cost, cost, bb.budget, 4);
  EXPECT_GT(by_tokens, 0.3);  // a long clip costs about twice a token-equal batch of short ones
  EXPECT_LT(by_cost, 0.05);
}

}  // namespace
}  // namespace vidit
