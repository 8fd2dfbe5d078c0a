#include "model/rope.h"

#include "model/layers.h"

namespace vidit {

std::array<at::Tensor, 2> rope_tables(int64_t frames, int64_t height, int64_t width,
                                      int64_t head_dim, double theta, const at::Device& device,
                                      std::array<int64_t, 3> offset) {
  const int64_t c = head_dim / 2;
  const int64_t n[3] = {c - 2 * (c / 3), c / 3, c / 3};
  const int64_t size[3] = {frames, height, width};
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<at::Tensor> parts;
  for (int a = 0; a < 3; ++a) {
    // angle[p, j] = (p + offset) * theta^(-j/n)
    at::Tensor pos = at::arange(size[a], f64) + static_cast<double>(offset[a]);
    at::Tensor inv = at::pow(theta, -at::arange(n[a], f64) / static_cast<double>(n[a]));
    at::Tensor ang = at::outer(pos, inv);  // [size, n]
    std::vector<int64_t> view = {1, 1, 1, n[a]}, expand = {frames, height, width, n[a]};
    view[a] = size[a];
    parts.push_back(ang.view(view).expand(expand));
  }
  at::Tensor angles = at::cat(parts, -1).reshape({frames * height * width, c});
  return {at::cos(angles).to(device, at::kFloat), at::sin(angles).to(device, at::kFloat)};
}

at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto sizes = x.sizes();
  at::Tensor pairs = fp32(x).reshape({sizes[0], sizes[1], sizes[2], sizes[3] / 2, 2});
  at::Tensor a = pairs.select(-1, 0), b = pairs.select(-1, 1);
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [L, 1, d/2]
  return at::stack({a * c - b * s, a * s + b * c}, -1).reshape(sizes);
}

}  // namespace vidit
