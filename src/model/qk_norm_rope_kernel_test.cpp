// Fused QK RMSNorm + RoPE: the fp64 references (forward and backward) against the model's own
// path, RMSNorm then RoPE through ATen autograd in fp64; on a CUDA build with a GPU, the fused
// kernels against the references for fp32 and bf16 inputs and every launch path (vector and
// scalar loads; backward blocks that take several rows).
// (In model/: the RoPE tables are the model's own, model/rope.h.)
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>

#include "kernels/qk_norm_rope.h"
#include "kernels/rmsnorm_cpu.h"
#include "kernels/rope_cpu.h"
#include "model/rope.h"

namespace vidit {
namespace {

constexpr double kEps = 1e-6;

struct Case {
  int64_t B, L, D, heads;
};

struct Inputs {
  at::Tensor x, weight, cos, sin, grad_y;
};

// x [B, L, D], weight near 1, the model's 3D RoPE tables for a 1 x L x 1 grid, a random grad_y.
Inputs make_inputs(const Case& k, at::ScalarType dt, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Inputs in;
  in.x = (at::randn({k.B, k.L, k.D}, gen, f32) * 3 + 0.25).to(dt);
  in.weight = 1 + at::randn({k.D}, gen, f32) * 0.2;
  auto tables = rope_tables(1, k.L, 1, k.D / k.heads, 10000.0, at::kCPU, {0, 0, 0});
  in.cos = tables[0], in.sin = tables[1];
  in.grad_y = at::randn({k.B, k.L, k.heads, k.D / k.heads}, gen, f32);
  return in;
}

// The model's path: RMSNorm over D, then the rotation of every head.
at::Tensor composite(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t heads) {
  at::Tensor n = rmsnorm_composite(x, weight, kEps);
  return rope_composite(n.view({x.size(0), x.size(1), heads, x.size(2) / heads}), cos, sin);
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.detach().to(at::kCPU, at::kDouble), y = b.detach().to(at::kCPU, at::kDouble);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(QkNormRope, ReferencesAreTheModelsNormThenRotation) {
  uint64_t seed = 1;
  for (const Case& k : {Case{2, 5, 16, 2}, Case{1, 7, 48, 4}, Case{2, 3, 64, 1}}) {
    const Inputs in = make_inputs(k, at::kFloat, seed++);
    at::Tensor x = in.x.to(at::kDouble).requires_grad_(), w = in.weight.to(at::kDouble).requires_grad_();
    at::Tensor y = composite(x, w, in.cos.to(at::kDouble), in.sin.to(at::kDouble), k.heads);
    (y * in.grad_y.to(at::kDouble)).sum().backward();
    const at::Tensor ref = qk_norm_rope_reference(in.x, in.weight, in.cos, in.sin, k.heads, kEps);
    const QkNormRopeGrads g = qk_norm_rope_backward_reference(in.x, in.weight, in.cos, in.sin, k.heads, kEps, in.grad_y);
    EXPECT_EQ(ref.sizes(), y.sizes());
    EXPECT_LT(max_rel(ref, y), 1e-6) << "D=" << k.D;  // the reference returns fp32
    EXPECT_LT(max_rel(g.x, x.grad()), 1e-6) << "D=" << k.D;
    EXPECT_LT(max_rel(g.weight, w.grad()), 1e-6) << "D=" << k.D;
  }
}

TEST(QkNormRope, AppliesOnlyWhereTheKernelsTakeTheInputs) {
  const Inputs in = make_inputs({1, 4, 64, 2}, at::kFloat, 8);
  EXPECT_FALSE(qk_norm_rope_applies(in.x, in.cos, in.sin, 2)) << "CPU tensors";
  if (!torch::cuda::is_available() || !qk_norm_rope_cuda_available()) return;
  const at::Device dev(at::kCUDA, 0);
  EXPECT_TRUE(qk_norm_rope_applies(in.x.to(dev), in.cos.to(dev), in.sin.to(dev), 2));
  EXPECT_FALSE(qk_norm_rope_applies(in.x.to(dev), in.cos.to(dev), in.sin.to(dev), 3)) << "heads do not split D";
  EXPECT_FALSE(qk_norm_rope_applies(in.x.to(dev), in.cos, in.sin, 2)) << "tables on another device";
  static_assert(96 * 128 > kQkNormRopeMaxDim);
  const at::Tensor wide = at::zeros({1, 1, 96 * 128}, at::TensorOptions().device(dev));
  const auto t = rope_tables(1, 1, 1, 128, 10000.0, dev);
  EXPECT_FALSE(qk_norm_rope_applies(wide, t[0], t[1], 96)) << "wider than the kernels take";
}

TEST(QkNormRope, ReferenceRefusesShapesItCannotSplit) {
  const Inputs in = make_inputs({1, 2, 16, 2}, at::kFloat, 9);
  EXPECT_THROW(qk_norm_rope_reference(in.x, in.weight, in.cos, in.sin, 3, kEps), std::exception);
  EXPECT_THROW(qk_norm_rope_reference(in.x, in.weight.narrow(0, 0, 8), in.cos, in.sin, 2, kEps), std::exception);
}

bool cuda_ready() { return qk_norm_rope_cuda_available() && torch::cuda::is_available(); }

// The kernels against the references: fp32 and bf16 x; D from one warp's worth to Wan 14B's
// 5120 and an odd pair count; a misaligned x (scalar loads).
TEST(QkNormRope, CudaMatchesTheReferences) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA kernels or no GPU";
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 100;
  double worst_y = 0, worst_dx = 0, worst_dw = 0;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    // 2 x 600 rows: more than the backward's 1024 blocks, so blocks reuse their sums over rows.
    for (const Case& k : {Case{2, 5, 64, 2}, Case{1, 37, 1536, 12}, Case{1, 9, 5120, 40}, Case{2, 3, 90, 3},
                          Case{2, 600, 128, 2}})
      for (bool misaligned : {false, true}) {
        const Inputs in = make_inputs(k, dt, seed++);
        at::Tensor xd = in.x.to(dev);
        if (misaligned) {
          at::Tensor buf = at::zeros({xd.numel() + 1}, xd.options());
          xd = buf.narrow(0, 1, xd.numel()).view(xd.sizes());
          xd.copy_(in.x.to(dev));
        }
        xd.requires_grad_();
        at::Tensor wd = in.weight.to(dev).requires_grad_();
        at::Tensor y = qk_norm_rope_fused(xd, wd, in.cos.to(dev), in.sin.to(dev), k.heads, kEps);
        (y * in.grad_y.to(dev)).sum().backward();
        const at::Tensor ref = qk_norm_rope_reference(in.x, in.weight, in.cos, in.sin, k.heads, kEps);
        const QkNormRopeGrads g =
            qk_norm_rope_backward_reference(in.x, in.weight, in.cos, in.sin, k.heads, kEps, in.grad_y);
        const std::string what = "D=" + std::to_string(k.D) + (dt == at::kBFloat16 ? " bf16" : " fp32") +
                                 (misaligned ? " misaligned" : "");
        ASSERT_EQ(xd.grad().scalar_type(), dt) << what;
        const double ey = max_rel(y, ref), ex = max_rel(xd.grad(), g.x), ew = max_rel(wd.grad(), g.weight);
        EXPECT_LT(ey, 1e-5) << what;
        EXPECT_LT(ex, dt == at::kBFloat16 ? 1e-2 : 1e-5) << what;  // dx is rounded to bf16
        EXPECT_LT(ew, 1e-4) << what;
        worst_y = std::max(worst_y, ey), worst_dx = std::max(worst_dx, ex), worst_dw = std::max(worst_dw, ew);
      }
  std::printf("LNM_MAXERR qk_norm_rope_forward %.3e\nLNM_MAXERR qk_norm_rope_grad_x %.3e\n"
              "LNM_MAXERR qk_norm_rope_grad_weight %.3e\n",
              worst_y, worst_dx, worst_dw);
}

TEST(QkNormRope, CudaRefusesWhatItCannotTake) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA kernels or no GPU";
  const Inputs in = make_inputs({1, 4, 64, 2}, at::kFloat, 7);
  const at::Device dev(at::kCUDA, 0);
  EXPECT_THROW(qk_norm_rope_fused(in.x, in.weight.to(dev), in.cos.to(dev), in.sin.to(dev), 2, kEps), std::exception);
  EXPECT_THROW(qk_norm_rope_fused(in.x.to(dev), in.weight.to(dev), in.cos.to(dev), in.sin.to(dev), 3, kEps),
               std::exception);
  EXPECT_THROW(qk_norm_rope_fused(in.x.to(dev).to(at::kDouble), in.weight.to(dev), in.cos.to(dev), in.sin.to(dev), 2,
                                  kEps),
               std::exception);
}

}  // namespace
}  // namespace vidit
