#include "loader/dataset.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"

namespace vidit {

std::pair<at::Tensor, at::Tensor> Dataset::batch(const std::vector<int64_t>& indices) const {
  std::vector<at::Tensor> lat, txt;
  for (int64_t i : indices) {
    Sample s = get(i);
    lat.push_back(s.latent);
    txt.push_back(s.text);
  }
  return {at::stack(lat), at::stack(txt)};
}

SyntheticDataset::SyntheticDataset(const Config& c, int64_t size, uint64_t seed)
    : latent_shape_{c.model.in_channels, c.data.latent_frames, c.data.latent_height, c.data.latent_width},
      text_shape_{c.model.text_len, c.model.text_dim},
      size_(size),
      seed_(seed) {}

Sample SyntheticDataset::get(int64_t i) const {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003ull + uint64_t(i));
  return {at::randn(latent_shape_, gen, at::kFloat), at::randn(text_shape_, gen, at::kFloat)};
}

}  // namespace vidit
