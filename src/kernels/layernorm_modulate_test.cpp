// Fused LayerNorm + adaLN modulation: the CPU reference against the ATen composition and a
// hand-computed example; on a CUDA build with a GPU, the fused kernel (forward and autograd
// backward) against the reference and the ATen composition.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>

#include "core/error.h"
#include "kernels/tensor_compare.h"
#include "kernels/layernorm_modulate.h"

namespace vidit {
namespace {

constexpr double kEps = 1e-6;  // Wan's LayerNorm eps

struct Shape {
  int64_t B, L, D;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t D : {7, 64, 96, 1536})
    for (int64_t L : {1, 5, 33}) out.push_back({2, L, D});
  return out;
}

std::string name(const Shape& s, at::ScalarType dt) {
  return "B=" + std::to_string(s.B) + " L=" + std::to_string(s.L) + " D=" + std::to_string(s.D) +
         (dt == at::kBFloat16 ? " bf16" : " fp32");
}

// Deterministic inputs on the CPU: x [B, L, D] of dtype dt, shift / scale [B, 1, D] fp32.
struct Inputs {
  at::Tensor x, shift, scale;
};

Inputs make_inputs(const Shape& s, at::ScalarType dt, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Inputs in;
  in.x = (at::randn({s.B, s.L, s.D}, gen, f32) * 2 + 0.5).to(dt);
  in.shift = at::randn({s.B, 1, s.D}, gen, f32) * 0.5;
  in.scale = at::randn({s.B, 1, s.D}, gen, f32) * 0.5;
  return in;
}

// The ATen composition the fused op replaces (what model/layers.cpp runs without the kernel).
at::Tensor composition(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                       double eps) {
  at::Tensor xf = x.to(at::kFloat);
  return at::layer_norm(xf, {xf.size(-1)}, {}, {}, eps) * (1 + scale) + shift;
}

using test::close;
using test::max_abs_diff;

bool cuda_ready() { return layernorm_modulate_cuda_available() && torch::cuda::is_available(); }

const char* kSkipMessage =
    "fused LayerNorm-modulate kernel not testable here: needs a CUDA build of vidit "
    "(VIDIT_HAVE_CUDA) and a visible GPU";

}  // namespace

// (a) The double-accumulating CPU reference equals the ATen composition.
TEST(LayerNormModulate, ReferenceMatchesAtenComposition) {
  uint64_t seed = 1;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (const Shape& s : shapes()) {
      const Inputs in = make_inputs(s, dt, seed++);
      const at::Tensor ref = layernorm_modulate_reference(in.x, in.shift, in.scale, kEps);
      const at::Tensor comp = composition(in.x, in.shift, in.scale, kEps);
      EXPECT_EQ(ref.scalar_type(), at::kFloat) << name(s, dt);
      EXPECT_TRUE(close(ref, comp, 1e-5, 1e-5)) << name(s, dt);
    }
}

// (b) With shift = scale = 0 every output row has mean 0 and (biased) variance 1.
TEST(LayerNormModulate, ReferenceRowsAreStandardized) {
  const Shape s{2, 5, 96};
  const Inputs in = make_inputs(s, at::kFloat, 42);
  const at::Tensor zero = at::zeros({s.B, 1, s.D});
  const at::Tensor y = layernorm_modulate_reference(in.x, zero, zero, kEps).to(at::kDouble);
  const at::Tensor mean = y.mean(-1);
  const at::Tensor var = (y - y.mean(-1, true)).pow(2).mean(-1);
  EXPECT_LT(mean.abs().max().item<double>(), 1e-6);
  EXPECT_LT((var - 1).abs().max().item<double>(), 1e-5);
}

// (b) x = [1, 2, 3, 4]: mean 2.5, var 1.25, xhat = [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25).
TEST(LayerNormModulate, ReferenceHandComputedExample) {
  const at::Tensor x = at::tensor({1.f, 2.f, 3.f, 4.f}).view({1, 1, 4});
  const at::Tensor shift = at::tensor({1.f, 0.f, 0.f, -1.f}).view({1, 1, 4});
  const at::Tensor scale = at::tensor({0.f, 1.f, -1.f, 0.5f}).view({1, 1, 4});
  const at::Tensor y = layernorm_modulate_reference(x, shift, scale, /*eps=*/0.0);
  const double r = 1.0 / std::sqrt(1.25);  // 0.894427191
  const double expect[4] = {-1.5 * r * 1 + 1,    // -0.341640786
                            -0.5 * r * 2 + 0,    // -0.894427191
                            0.5 * r * 0 + 0,     //  0
                            1.5 * r * 1.5 - 1};  //  1.012461180
  ASSERT_EQ(y.sizes(), x.sizes());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[0][0][i].item<double>(), expect[i], 1e-6) << i;
  EXPECT_NEAR(expect[0], -0.341640786, 1e-8);
  EXPECT_NEAR(expect[3], 1.012461180, 1e-8);
}

TEST(LayerNormModulate, ReferenceRejectsBadShapes) {
  EXPECT_THROW(layernorm_modulate_reference(at::zeros({4, 8}), at::zeros({1, 1, 8}),
                                            at::zeros({1, 1, 8}), kEps),
               Error);
  EXPECT_THROW(layernorm_modulate_reference(at::zeros({2, 3, 8}), at::zeros({2, 1, 7}),
                                            at::zeros({2, 1, 8}), kEps),
               Error);
}

// Without a usable kernel (or on CPU tensors) the fused entry point throws a vidit::Error.
TEST(LayerNormModulate, FusedRejectsCpuTensors) {
  EXPECT_THROW(layernorm_modulate_fused(at::zeros({1, 2, 8}), at::zeros({1, 1, 8}),
                                        at::zeros({1, 1, 8}), kEps),
               Error);
}

// (c) The CUDA kernel equals the reference, fp32 and bf16, every shape.
TEST(LayerNormModulate, CudaMatchesReference) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 100;
  double worst = 0;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (const Shape& s : shapes()) {
      const Inputs in = make_inputs(s, dt, seed++);
      const at::Tensor y =
          layernorm_modulate_fused(in.x.to(dev), in.shift.to(dev), in.scale.to(dev), kEps);
      ASSERT_TRUE(y.is_cuda()) << name(s, dt);
      ASSERT_EQ(y.scalar_type(), at::kFloat) << name(s, dt);
      const at::Tensor ref = layernorm_modulate_reference(in.x, in.shift, in.scale, kEps);
      EXPECT_TRUE(close(y, ref, 1e-5, 1e-5)) << name(s, dt);
      worst = std::max(worst, max_abs_diff(y, ref));
    }
  std::printf("LNM_MAXERR forward %.3e\n", worst);
}

// (c) Every launch path: warp / 128 / 512 threads per row, the large-D fallback, vector (D % 4
// == 0, aligned) and scalar loads, a misaligned x, and strided shift / scale from chunk().
TEST(LayerNormModulate, CudaLaunchPathsMatchReference) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 200;
  double worst = 0;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (int64_t D : {1, 33, 1024, 1025, 2052, 4096, 4097, 5120, 16384, 16388, 20001}) {
      const Shape s{2, 3, D};
      const Inputs in = make_inputs(s, dt, seed++);
      const at::Tensor ref = layernorm_modulate_reference(in.x, in.shift, in.scale, kEps);
      at::Tensor y = layernorm_modulate_fused(in.x.to(dev), in.shift.to(dev), in.scale.to(dev),
                                              kEps);
      EXPECT_TRUE(close(y, ref, 1e-5, 1e-5)) << name(s, dt);
      worst = std::max(worst, max_abs_diff(y, ref));

      // x one element past an aligned address: contiguous, but not vector-aligned.
      const int64_t n = s.B * s.L * s.D;
      at::Tensor buf = at::zeros({n + 1}, at::TensorOptions().dtype(dt).device(dev));
      at::Tensor x_off = buf.narrow(0, 1, n).view({s.B, s.L, s.D});
      x_off.copy_(in.x.to(dev));
      // shift / scale as chunks of one [B, 2, D] tensor: strided, like the DiT's modulation.
      at::Tensor mod = at::cat({in.shift, in.scale}, 1).to(dev);
      auto parts = mod.chunk(2, 1);
      y = layernorm_modulate_fused(x_off, parts[0], parts[1], kEps);
      EXPECT_TRUE(close(y, ref, 1e-5, 1e-5)) << name(s, dt) << " (misaligned x, strided mod)";
      worst = std::max(worst, max_abs_diff(y, ref));
    }
  std::printf("LNM_MAXERR launch_paths %.3e\n", worst);
}

// (c) Gradients through torch::autograd equal those of the ATen composition.
TEST(LayerNormModulate, CudaGradientsMatchAten) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 300;
  double worst = 0;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (const Shape& s : shapes()) {
      const Inputs in = make_inputs(s, dt, seed++);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1000);
      const at::Tensor w = at::randn({s.B, s.L, s.D}, gen, at::TensorOptions()).to(dev);
      auto grads_of = [&](bool fused) {
        at::Tensor x = in.x.to(dev).requires_grad_(true);
        at::Tensor shift = in.shift.to(dev).requires_grad_(true);
        at::Tensor scale = in.scale.to(dev).requires_grad_(true);
        at::Tensor y = fused ? layernorm_modulate_fused(x, shift, scale, kEps)
                             : composition(x, shift, scale, kEps);
        at::Tensor loss = (y * w).sum();
        return torch::autograd::grad({loss}, {x, shift, scale});
      };
      const auto gf = grads_of(true);
      const auto ga = grads_of(false);
      ASSERT_EQ(gf.size(), 3u);
      EXPECT_EQ(gf[0].scalar_type(), dt) << name(s, dt);
      EXPECT_EQ(gf[1].scalar_type(), at::kFloat) << name(s, dt);
      EXPECT_EQ(gf[2].scalar_type(), at::kFloat) << name(s, dt);
      // grad_x of a bf16 x is rounded to bf16 by both paths: allow a couple of bf16 ulps.
      const double tol_x = dt == at::kBFloat16 ? 2e-2 : 1e-4;
      EXPECT_TRUE(close(gf[0], ga[0], tol_x, tol_x)) << name(s, dt) << " grad_x";
      EXPECT_TRUE(close(gf[1], ga[1], 1e-4, 1e-4)) << name(s, dt) << " grad_shift";
      EXPECT_TRUE(close(gf[2], ga[2], 1e-4, 1e-4)) << name(s, dt) << " grad_scale";
      if (dt == at::kFloat)
        for (int i = 0; i < 3; ++i) worst = std::max(worst, max_abs_diff(gf[i], ga[i]));
    }
  std::printf("LNM_MAXERR grad_fp32 %.3e\n", worst);
}

// (c) Only some inputs need a gradient (a frozen modulation): backward skips the others.
TEST(LayerNormModulate, CudaPartialGradients) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  const Shape s{2, 5, 64};
  const Inputs in = make_inputs(s, at::kFloat, 400);
  at::Tensor x = in.x.to(dev).requires_grad_(true);
  const at::Tensor shift = in.shift.to(dev), scale = in.scale.to(dev);
  const auto gf = torch::autograd::grad({layernorm_modulate_fused(x, shift, scale, kEps).sum()}, {x});
  at::Tensor x2 = in.x.to(dev).requires_grad_(true);
  const auto ga = torch::autograd::grad({composition(x2, shift, scale, kEps).sum()}, {x2});
  EXPECT_TRUE(close(gf[0], ga[0], 1e-4, 1e-4));
}

}  // namespace vidit
