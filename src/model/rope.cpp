#include "model/rope.h"

#include "kernels/rope_cpu.h"
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
  at::Tensor xf = fp32(x);
  const bool fused = xf.device().is_cpu() && !cos.requires_grad() && !sin.requires_grad();
  return fused ? rope_cpu_fused(xf, cos, sin) : rope_composite(xf, cos, sin);
}

}  // namespace vidit
