#include "loader/epoch_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"

namespace vidit {

EpochSampler::EpochSampler(int64_t size, uint64_t seed) : size_(size) {
  VIDIT_CHECK(size > 0, "EpochSampler: the dataset is empty");
  state_.seed = seed;
  build_permutation();
}

void EpochSampler::build_permutation() {
  at::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(state_.seed * 6364136223846793005ull + uint64_t(state_.epoch) + 1);
  at::Tensor p = at::randperm(size_, gen, at::kLong);
  perm_.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + size_);
}

std::vector<int64_t> EpochSampler::next(int64_t batch_size) {
  std::vector<int64_t> out;
  while (int64_t(out.size()) < batch_size) {
    if (state_.position == size_) {
      ++state_.epoch;
      state_.position = 0;
      build_permutation();
    }
    out.push_back(perm_[state_.position++]);
  }
  return out;
}

void EpochSampler::set_state(const SamplerState& s) {
  VIDIT_CHECK(s.position >= 0 && s.position <= size_ && s.epoch >= 0,
              "sampler state (epoch ", s.epoch, ", position ", s.position,
              ") does not fit a dataset of ", size_, " samples: was the checkpoint made with other data?");
  state_ = s;
  build_permutation();
}

}  // namespace vidit
