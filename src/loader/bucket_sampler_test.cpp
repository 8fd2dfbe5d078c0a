// The token-budget bucket sampler: determinism, one bucket per batch, the budget, disjoint
// ranks covering every sample once per epoch, and resume at the same and another world size.
#include "loader/bucket_sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/error.h"

namespace vidit {
namespace {

// 103 samples over 3 buckets of 100, 300 and 1000 tokens per sample; budget 1000 tokens.
struct Fixture {
  std::vector<int> bucket_of;
  std::vector<int64_t> tokens{100, 300, 1000};
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
    EXPECT_LE(int64_t(batch.size()) * f.tokens[size_t(b)], 1000);
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

}  // namespace
}  // namespace vidit
