// The fused CPU RMSNorm and RoPE against their ATen compositions: values and both gradients,
// fp32 and fp64, odd sizes (rows not a multiple of the grain, one row, head dims of 2 and 6).
// (In model/: the RoPE tables are the model's own, model/rope.h.)
#include <gtest/gtest.h>

#include "kernels/rmsnorm_cpu.h"
#include "kernels/rope_cpu.h"
#include "model/rope.h"

namespace vidit {
namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(FusedCpu, RMSNormMatchesCompositeWithGradients) {
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    const double tol = dt == at::kDouble ? 1e-12 : 2e-6;
    for (auto shape : std::vector<std::vector<int64_t>>{{3, 67, 48}, {1, 1, 5}, {2, 130, 96}}) {
      at::manual_seed(1);
      at::Tensor x = (at::randn(shape, dt) * 3 + 0.5).requires_grad_();
      at::Tensor w = at::randn({shape.back()}, dt).requires_grad_();
      at::Tensor gy = at::randn(shape, dt);
      at::Tensor y = rmsnorm_cpu_fused(x, w, 1e-6);
      auto g = torch::autograd::grad({y}, {x, w}, {gy});
      at::Tensor yr = rmsnorm_composite(x, w, 1e-6);
      auto gr = torch::autograd::grad({yr}, {x, w}, {gy});
      EXPECT_LT(rel(y, yr), tol) << dt << " " << x.sizes();
      EXPECT_LT(rel(g[0], gr[0]), 10 * tol) << "dx " << dt << " " << x.sizes();
      EXPECT_LT(rel(g[1], gr[1]), 10 * tol) << "dweight " << dt << " " << x.sizes();
    }
  }
}

TEST(FusedCpu, RMSNormRowsHaveUnitRms) {
  at::Tensor x = at::randn({5, 33}) * 7;
  at::Tensor y = rmsnorm_cpu_fused(x, at::ones({33}), 0.0);
  EXPECT_TRUE(at::allclose(y.pow(2).mean(-1), at::ones({5}), 1e-5, 1e-5));
  // A non-contiguous input gives what its contiguous copy gives.
  at::Tensor xt = at::randn({33, 5}).t();
  EXPECT_TRUE(at::equal(rmsnorm_cpu_fused(xt, at::ones({33}), 1e-6), rmsnorm_cpu_fused(xt.contiguous(), at::ones({33}), 1e-6)));
}

TEST(FusedCpu, RopeMatchesCompositeWithGradients) {
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    const double tol = dt == at::kDouble ? 1e-12 : 1e-6;
    for (auto [B, f, h, w, H, hd] : std::vector<std::array<int64_t, 6>>{{2, 3, 4, 5, 2, 6}, {1, 1, 1, 1, 1, 2}, {3, 2, 4, 4, 3, 32}}) {
      auto [cos, sin] = rope_tables(f, h, w, hd, 10000.0, at::kCPU);
      const int64_t L = f * h * w;
      at::manual_seed(2);
      at::Tensor x = at::randn({B, L, H, hd}, dt).requires_grad_();
      at::Tensor gy = at::randn({B, L, H, hd}, dt);
      at::Tensor y = rope_cpu_fused(x, cos, sin);
      at::Tensor gx = torch::autograd::grad({y}, {x}, {gy})[0];
      at::Tensor yr = rope_composite(x, cos, sin);
      at::Tensor gxr = torch::autograd::grad({yr}, {x}, {gy})[0];
      EXPECT_LT(rel(y, yr), tol) << dt << " hd " << hd;
      EXPECT_LT(rel(gx, gxr), tol) << dt << " hd " << hd;
      // A rotation keeps each pair's length.
      EXPECT_TRUE(at::allclose(y.detach().pow(2).sum(-1), x.detach().pow(2).sum(-1), 1e-5, 1e-5));
    }
  }
}

TEST(FusedCpu, RopeRejectsMismatchedTables) {
  auto [cos, sin] = rope_tables(2, 2, 2, 8, 100.0, at::kCPU);
  EXPECT_THROW(rope_cpu_fused(at::randn({1, 7, 2, 8}), cos, sin), c10::Error);
  EXPECT_THROW(rope_cpu_fused(at::randn({1, 8, 2, 6}), cos, sin), c10::Error);
}

}  // namespace
}  // namespace vidit
