// Deterministic batches over a dataset: each epoch is a permutation drawn from (seed, epoch);
// batches are taken in order and an epoch's incomplete tail rolls into the next epoch's
// permutation, so no sample is silently dropped. The state (epoch, position) is three integers
// stored in checkpoints; restoring it continues exactly where the run stopped.
#pragma once
#include <cstdint>
#include <vector>

namespace vidit {

struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t position = 0;  // index into the current epoch's permutation
};

class EpochSampler {
 public:
  EpochSampler(int64_t dataset_size, uint64_t seed);
  std::vector<int64_t> next(int64_t batch_size);
  SamplerState state() const { return state_; }
  void set_state(const SamplerState& s);

 private:
  void build_permutation();
  int64_t size_;
  SamplerState state_;
  std::vector<int64_t> perm_;
};

}  // namespace vidit
