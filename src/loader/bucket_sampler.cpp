#include "loader/bucket_sampler.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <random>

#include "core/error.h"

namespace vidit {
namespace {

// Fisher-Yates with a fully specified generator, so orders are identical on every platform
// (std::shuffle's algorithm is left to the library).
template <typename T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

uint64_t mix(uint64_t seed, int64_t epoch, int64_t salt) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(epoch) + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  x ^= (uint64_t(salt) + 1) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Samples of cost `cost` that fit in `budget`, at least one. The ratio is nudged up by 1e-9 so a
// budget that is exactly k samples' cost, computed in floating point, gives k and not k - 1.
int64_t fitting(double budget, double cost) {
  return std::max<int64_t>(1, int64_t(std::floor(budget / cost * (1 + 1e-9))));
}

// Mean cost of a full batch (buckets weighted by their batches per epoch) over the costliest.
double efficiency(const std::vector<double>& cost, const std::vector<int64_t>& samples, double budget) {
  double weighted = 0, weights = 0, costliest = 0;
  for (size_t b = 0; b < cost.size(); ++b) {
    if (samples[b] == 0) continue;
    const int64_t n = fitting(budget, cost[b]);
    const double batches = std::ceil(double(samples[b]) / double(n)), full = double(n) * cost[b];
    weighted += batches * full, weights += batches, costliest = std::max(costliest, full);
  }
  return costliest > 0 ? weighted / weights / costliest : 1.0;
}

}  // namespace

BalancedBudget balanced_budget(const std::vector<double>& cost, const std::vector<int64_t>& samples, double budget) {
  VIDIT_CHECK(cost.size() == samples.size(), "balanced budget: ", cost.size(), " bucket costs but ", samples.size(),
              " bucket sizes");
  VIDIT_CHECK(budget > 0 && std::isfinite(budget), "balanced budget: the budget must be positive (got ", budget, ")");
  for (size_t b = 0; b < cost.size(); ++b)
    VIDIT_CHECK(cost[b] > 0 && std::isfinite(cost[b]), "balanced budget: bucket ", b, " costs ", cost[b],
                " per sample; a cost must be positive");
  std::vector<double> candidates{budget};
  const double most = budget * (1 + kBudgetSlack);
  for (size_t b = 0; b < cost.size(); ++b) {
    if (samples[b] == 0 || fitting(budget, cost[b]) > 64) continue;
    for (int64_t k = fitting(most, cost[b]); k >= 1 && double(k) * cost[b] >= budget / 2; --k)
      if (double(k) * cost[b] <= most) candidates.push_back(double(k) * cost[b]);
  }
  BalancedBudget out;
  out.efficiency_unbalanced = efficiency(cost, samples, budget);
  double best = 0;
  for (double t : candidates) best = std::max(best, efficiency(cost, samples, t));
  // Among those within 0.002 of the best (equal but for rounding), the nearest to the budget asked for
  // (the larger on a tie).
  double distance = 1e300;
  for (double t : candidates) {
    const double e = efficiency(cost, samples, t), d = std::abs(std::log(t / budget));
    if (e >= best - 0.002 && (d < distance || (d == distance && t > out.budget)))
      out.budget = t, out.efficiency = e, distance = d;
  }
  return out;
}

BucketBatchSampler::BucketBatchSampler(std::vector<int> bucket_of, std::vector<double> cost_of_bucket, double budget,
                                       uint64_t seed, int rank, int world)
    : bucket_of_(std::move(bucket_of)), cost_(std::move(cost_of_bucket)), budget_(budget), rank_(rank),
      world_(world) {
  VIDIT_CHECK(!bucket_of_.empty(), "bucket sampler: the dataset is empty");
  VIDIT_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "bucket sampler: rank ", rank_, " outside world ", world_);
  VIDIT_CHECK(budget_ > 0 && std::isfinite(budget_), "bucket sampler: the batch budget must be positive (got ",
              budget_, "); check data.token_budget");
  for (size_t i = 0; i < bucket_of_.size(); ++i)
    VIDIT_CHECK(bucket_of_[i] >= 0 && size_t(bucket_of_[i]) < cost_.size(), "bucket sampler: sample ", i,
                " has bucket ", bucket_of_[i], " but there are ", cost_.size(), " buckets");
  for (size_t b = 0; b < cost_.size(); ++b)
    VIDIT_CHECK(cost_[b] > 0 && std::isfinite(cost_[b]), "bucket sampler: bucket ", b, " costs ", cost_[b],
                " per sample; a cost must be positive");
  state_.seed = seed;
  build_plan();
}

int64_t BucketBatchSampler::batch_size_of_bucket(int b) const { return fitting(budget_, cost_.at(size_t(b))); }

std::vector<std::vector<int64_t>> BucketBatchSampler::epoch_batches(int64_t epoch) const {
  std::vector<std::vector<int64_t>> members(cost_.size());
  for (size_t i = 0; i < bucket_of_.size(); ++i) members[size_t(bucket_of_[i])].push_back(int64_t(i));
  std::vector<std::vector<int64_t>> batches;
  for (size_t b = 0; b < members.size(); ++b) {
    std::mt19937_64 rng(mix(state_.seed, epoch, int64_t(b) + 1));
    shuffle(members[b], rng);
    const size_t per = size_t(fitting(budget_, cost_[b]));
    for (size_t i = 0; i < members[b].size(); i += per)
      batches.emplace_back(members[b].begin() + long(i), members[b].begin() + long(std::min(i + per, members[b].size())));
  }
  std::mt19937_64 rng(mix(state_.seed, epoch, 0));
  shuffle(batches, rng);
  return batches;
}

void BucketBatchSampler::build_plan() {
  // The rest of the epoch, in canonical order: skip `consumed` samples.
  std::vector<std::vector<int64_t>> rest;
  int64_t skip = state_.consumed;
  for (auto& b : epoch_batches(state_.epoch)) {
    if (skip >= int64_t(b.size())) { skip -= int64_t(b.size()); continue; }
    rest.emplace_back(b.begin() + skip, b.end());
    skip = 0;
  }
  VIDIT_CHECK(skip == 0, "bucket sampler: the saved position (", state_.consumed, " samples into epoch ", state_.epoch,
              ") is past the end of the epoch; was the dataset changed since the checkpoint?");
  // Cut the costliest batches into contiguous pieces until the count is a multiple of world.
  const size_t need = (size_t(world_) - rest.size() % size_t(world_)) % size_t(world_);
  std::vector<size_t> pieces(rest.size(), 1);
  using Item = std::pair<double, size_t>;  // (cost per piece, batch)
  std::priority_queue<Item> heap;
  for (size_t i = 0; i < rest.size(); ++i)
    if (rest[i].size() > 1) heap.emplace(double(rest[i].size()) * cost_[size_t(bucket_of_[size_t(rest[i][0])])], i);
  size_t added = 0;
  while (added < need && !heap.empty()) {
    auto [cost, i] = heap.top();
    heap.pop();
    ++pieces[i], ++added;
    if (pieces[i] < rest[i].size()) heap.emplace(cost * double(pieces[i] - 1) / double(pieces[i]), i);
  }
  plan_.clear();
  for (size_t i = 0; i < rest.size(); ++i) {
    const size_t n = rest[i].size(), k = pieces[i];
    for (size_t p = 0; p < k; ++p)
      plan_.emplace_back(rest[i].begin() + long(n * p / k), rest[i].begin() + long(n * (p + 1) / k));
  }
  for (; added < need; ++added) plan_.emplace_back();  // only when every batch is one sample
  step_ = 0;
}

std::vector<int64_t> BucketBatchSampler::next() {
  if (step_ * world_ >= int64_t(plan_.size())) {
    ++state_.epoch;
    state_.consumed = 0;
    build_plan();
  }
  std::vector<int64_t> mine = plan_[size_t(step_ * world_ + rank_)];
  for (int r = 0; r < world_; ++r) state_.consumed += int64_t(plan_[size_t(step_ * world_ + r)].size());
  ++step_;
  return mine;
}

void BucketBatchSampler::set_state(const BucketSamplerState& s) {
  VIDIT_CHECK(s.epoch >= 0 && s.consumed >= 0, "bucket sampler: bad saved state (epoch ", s.epoch, ", consumed ",
              s.consumed, ")");
  state_ = s;
  build_plan();
}

}  // namespace vidit
