// Fused gated residual + LayerNorm + modulate. On every machine: the ATen composite against the
// fp64 reference and a hand-computed example, and the backward formulas the CUDA op uses
// (residual_layernorm_backward_reference) against the composite's fp64 autograd and against
// finite differences. On a CUDA build with a GPU: the fused kernel against the reference on
// every launch path, and its autograd backward against the composite's.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/tensor_compare.h"
#include "kernels/residual_layernorm.h"

namespace vidit {
namespace {

constexpr double kEps = 1e-6;  // Wan's LayerNorm eps

// The op's tensor arguments, in order.
enum Arg { kX, kY, kGate, kWeight, kBias, kShift, kScale, kNumArgs };
const char* const kArgNames[kNumArgs] = {"x", "y", "gate", "weight", "bias", "shift", "scale"};
using Args = std::array<at::Tensor, kNumArgs>;

// Which optional operands a case has.
struct Combo {
  const char* name;
  bool gate, affine, modulate;
};
constexpr Combo kAttnNorm3{"attn_norm3", true, true, false};  // x + o(attn) * gate, then norm3
constexpr Combo kCrossFfn{"cross_ffn", false, false, true};   // x + cross_attn, then modulate
constexpr Combo kAll{"all", true, true, true};
constexpr Combo kPlain{"plain", false, false, false};
const Combo kCombos[] = {kAttnNorm3, kCrossFfn, kAll, kPlain};

std::string name(const Combo& c, int64_t D, at::ScalarType y_dtype) {
  return std::string(c.name) + " D=" + std::to_string(D) +
         (y_dtype == at::kBFloat16 ? " bf16 y" : " fp32 y");
}

// Deterministic CPU inputs: x fp32, y of y_dtype, the combo's optional operands fp32.
Args make_args(int64_t B, int64_t L, int64_t D, const Combo& c, at::ScalarType y_dtype,
               uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Args a;
  a[kX] = at::randn({B, L, D}, gen, f32) * 2 + 0.5;
  a[kY] = at::randn({B, L, D}, gen, f32).to(y_dtype);
  a[kGate] = at::randn({B, 1, D}, gen, f32) * 0.5;
  a[kWeight] = 1 + at::randn({D}, gen, f32) * 0.1;
  a[kBias] = at::randn({D}, gen, f32) * 0.1;
  a[kShift] = at::randn({B, 1, D}, gen, f32) * 0.5;
  a[kScale] = at::randn({B, 1, D}, gen, f32) * 0.5;
  if (!c.gate) a[kGate] = at::Tensor();
  if (!c.affine) a[kWeight] = a[kBias] = at::Tensor();
  if (!c.modulate) a[kShift] = a[kScale] = at::Tensor();
  return a;
}

Args map(const Args& a, const std::function<at::Tensor(const at::Tensor&)>& f) {
  Args out;
  for (int i = 0; i < kNumArgs; ++i)
    if (a[i].defined()) out[i] = f(a[i]);
  return out;
}

Args to_double(const Args& a) {
  return map(a, [](const at::Tensor& t) { return t.to(at::kDouble); });
}

Args to_device(const Args& a, const at::Device& dev) {
  return map(a, [&](const at::Tensor& t) { return t.to(dev); });
}

using OpFn = ResidualNorm (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, double);

ResidualNorm run(OpFn op, const Args& a) {
  return op(a[kX], a[kY], a[kGate], a[kWeight], a[kBias], a[kShift], a[kScale], kEps);
}

using test::close;
using test::max_abs_diff;

// Gradients of sum(r * g_r) + sum(out * g_out) (an undefined weight drops its term) with respect
// to every defined argument, through the op's autograd; undefined where the argument is. With
// `chunked`, gate / shift / scale are strided chunks of one [B, 3, D] leaf, as in the DiT block.
Args grads_of(OpFn op, const Args& in, const at::Tensor& g_r, const at::Tensor& g_out,
              bool chunked = false) {
  Args leaf = map(in, [](const at::Tensor& t) { return t.detach().clone().requires_grad_(true); });
  Args use = leaf;
  at::Tensor mod;
  if (chunked) {
    const at::Tensor zero = at::zeros_like(in[kX].select(1, 0).unsqueeze(1));
    std::vector<at::Tensor> parts;
    for (Arg i : {kGate, kShift, kScale}) parts.push_back(in[i].defined() ? in[i] : zero);
    mod = at::cat(parts, 1).detach().requires_grad_(true);
    const auto ch = mod.chunk(3, 1);
    int k = 0;
    for (Arg i : {kGate, kShift, kScale}) {
      if (in[i].defined()) use[i] = ch[k];
      leaf[i] = at::Tensor();
      ++k;
    }
  }
  const ResidualNorm o = run(op, use);
  // Leave an unused output out of the graph, so its incoming gradient is undefined.
  at::Tensor loss;
  if (g_r.defined()) loss = (o.residual * g_r).sum();
  if (g_out.defined()) {
    const at::Tensor term = (o.out * g_out).sum();
    loss = loss.defined() ? loss + term : term;
  }
  std::vector<at::Tensor> wrt;
  for (const at::Tensor& t : leaf)
    if (t.defined()) wrt.push_back(t);
  if (mod.defined()) wrt.push_back(mod);
  const auto g = torch::autograd::grad({loss}, wrt, {}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
  Args out;
  size_t k = 0;
  for (int i = 0; i < kNumArgs; ++i)
    if (leaf[i].defined()) out[i] = g[k++];
  if (mod.defined()) {
    const auto gm = g[k].defined() ? g[k].chunk(3, 1) : std::vector<at::Tensor>(3);
    int j = 0;
    for (Arg i : {kGate, kShift, kScale}) {
      if (in[i].defined()) out[i] = gm[j];
      ++j;
    }
  }
  // An unused input (allow_unused) has an undefined gradient: compare it as zeros.
  for (int i = 0; i < kNumArgs; ++i)
    if (in[i].defined() && !out[i].defined()) out[i] = at::zeros_like(in[i]);
  return out;
}

Args reference_grads(const Args& a, const at::Tensor& g_r, const at::Tensor& g_out) {
  const ResidualNormGrads g = residual_layernorm_backward_reference(
      a[kX], a[kY], a[kGate], a[kWeight], a[kBias], a[kShift], a[kScale], kEps, g_r, g_out);
  return {g.x, g.y, g.gate, g.weight, g.bias, g.shift, g.scale};
}

bool cuda_ready() { return residual_layernorm_cuda_available() && torch::cuda::is_available(); }

const char* kSkipMessage =
    "fused residual LayerNorm kernel not testable here: needs a CUDA build of vidit "
    "(VIDIT_HAVE_CUDA) and a visible GPU";

}  // namespace

// The ATen composite equals the fp64 reference for every combination of optional operands,
// odd and vector-friendly D, fp32 and bf16 y.
TEST(ResidualLayerNorm, CompositeMatchesReference) {
  uint64_t seed = 1;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (int64_t D : {37, 64})
      for (int64_t L : {1, 5})
        for (const Combo& c : kCombos) {
          const Args a = make_args(2, L, D, c, dt, seed++);
          const ResidualNorm ref = run(residual_layernorm_reference, a);
          const ResidualNorm comp = run(residual_layernorm_composite, a);
          EXPECT_EQ(ref.residual.scalar_type(), at::kFloat) << name(c, D, dt);
          EXPECT_EQ(ref.out.scalar_type(), at::kFloat) << name(c, D, dt);
          EXPECT_EQ(comp.out.scalar_type(), at::kFloat) << name(c, D, dt);
          EXPECT_TRUE(close(comp.residual, ref.residual, 1e-5, 1e-5)) << name(c, D, dt) << " r";
          EXPECT_TRUE(close(comp.out, ref.out, 1e-5, 1e-5)) << name(c, D, dt) << " out";
        }
}

// r = x + y * gate = [1, 2, 3, 4]: mean 2.5, var 1.25, xhat = [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25).
TEST(ResidualLayerNorm, ReferenceHandComputedExample) {
  const auto v = [](std::initializer_list<float> l, std::vector<int64_t> shape) {
    return at::tensor(std::vector<float>(l)).view(shape);
  };
  const at::Tensor x = v({0.5f, 1.f, 2.5f, 2.f}, {1, 1, 4});
  const at::Tensor y = v({1.f, 2.f, 1.f, 4.f}, {1, 1, 4});
  const at::Tensor gate = v({0.5f, 0.5f, 0.5f, 0.5f}, {1, 1, 4});
  const at::Tensor weight = v({2.f, 1.f, 1.f, 1.f}, {4});
  const at::Tensor bias = v({0.f, 0.f, 0.f, 1.f}, {4});
  const at::Tensor shift = v({1.f, 0.f, 0.f, -1.f}, {1, 1, 4});
  const at::Tensor scale = v({0.f, 1.f, -1.f, 0.5f}, {1, 1, 4});
  const ResidualNorm o =
      residual_layernorm_reference(x, y, gate, weight, bias, shift, scale, /*eps=*/0.0);
  const double s = 1.0 / std::sqrt(1.25);  // 0.894427191
  const double r[4] = {1, 2, 3, 4};
  const double n[4] = {-1.5 * s * 2, -0.5 * s, 0.5 * s, 1.5 * s + 1};  // after the affine
  const double expect[4] = {n[0] * 1 + 1,    // -1.683281573
                            n[1] * 2 + 0,    // -0.894427191
                            n[2] * 0 + 0,    //  0
                            n[3] * 1.5 - 1};  //  2.512461180
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(o.residual[0][0][i].item<double>(), r[i], 1e-6) << i;
    EXPECT_NEAR(o.out[0][0][i].item<double>(), expect[i], 1e-6) << i;
  }
  EXPECT_NEAR(expect[0], -1.683281573, 1e-8);
  EXPECT_NEAR(expect[3], 2.512461180, 1e-8);
  // No gate, no affine, no modulation: r = x + y, out = xhat.
  const ResidualNorm p = residual_layernorm_reference(x, y, {}, {}, {}, {}, {}, 0.0);
  EXPECT_NEAR(p.residual[0][0][3].item<double>(), 6.0, 1e-6);  // 2 + 4
}

TEST(ResidualLayerNorm, ReferenceRejectsBadShapes) {
  const at::Tensor x = at::zeros({2, 3, 8});
  EXPECT_THROW(residual_layernorm_reference(x, at::zeros({2, 3, 7}), {}, {}, {}, {}, {}, kEps),
               Error);
  EXPECT_THROW(residual_layernorm_reference(x, x, at::zeros({2, 3, 8}), {}, {}, {}, {}, kEps),
               Error);
  EXPECT_THROW(residual_layernorm_reference(x, x, {}, at::zeros({7}), {}, {}, {}, kEps), Error);
  EXPECT_THROW(residual_layernorm_composite(x, x, {}, {}, {}, at::zeros({1, 1, 8}), {}, kEps),
               Error);
  EXPECT_THROW(residual_layernorm_reference(at::zeros({4, 8}), at::zeros({4, 8}), {}, {}, {}, {},
                                            {}, kEps),
               Error);
}

// Without a usable kernel (or on CPU tensors) the fused entry point throws a vidit::Error.
TEST(ResidualLayerNorm, FusedRejectsCpuTensors) {
  const at::Tensor x = at::zeros({1, 2, 8});
  EXPECT_THROW(residual_layernorm_fused(x, x, {}, {}, {}, {}, {}, kEps), Error);
}

// The backward formulas (fp64) equal the composite's fp64 autograd, for both outputs' grads,
// either alone, and every combination of optional operands.
TEST(ResidualLayerNorm, BackwardReferenceMatchesCompositeAutograd) {
  uint64_t seed = 50;
  for (int64_t D : {37, 64})
    for (const Combo& c : kCombos)
      for (int which = 0; which < 3; ++which) {  // both grads, g_r only, g_out only
        const Args a = to_double(make_args(2, 5, D, c, at::kFloat, seed++));
        auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1000);
        const auto f64 = at::TensorOptions().dtype(at::kDouble);
        at::Tensor g_r = at::randn({2, 5, D}, gen, f64), g_out = at::randn({2, 5, D}, gen, f64);
        if (which == 1) g_out = at::Tensor();
        if (which == 2) g_r = at::Tensor();
        const Args ga = grads_of(residual_layernorm_composite, a, g_r, g_out);
        const Args gr = reference_grads(a, g_r, g_out);
        for (int i = 0; i < kNumArgs; ++i)
          EXPECT_TRUE(close(gr[i], ga[i], 1e-10, 1e-10))
              << name(c, D, at::kFloat) << " grads " << which << " d" << kArgNames[i];
      }
}

// The backward formulas equal central finite differences of the fp64 composite.
TEST(ResidualLayerNorm, BackwardReferenceMatchesFiniteDifferences) {
  const Args a = to_double(make_args(2, 3, 5, kAll, at::kFloat, 77));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(78);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor g_r = at::randn({2, 3, 5}, gen, f64), g_out = at::randn({2, 3, 5}, gen, f64);
  const auto loss = [&](const Args& p) {
    const ResidualNorm o = run(residual_layernorm_composite, p);
    return ((o.residual * g_r).sum() + (o.out * g_out).sum()).item<double>();
  };
  const Args g = reference_grads(a, g_r, g_out);
  const double h = 1e-6;
  for (int i = 0; i < kNumArgs; ++i) {
    ASSERT_TRUE(g[i].defined()) << kArgNames[i];
    const at::Tensor gi = g[i].contiguous();
    for (int64_t k = 0; k < a[i].numel(); ++k) {
      Args p = a;
      p[i] = a[i].clone();
      double* e = p[i].data_ptr<double>();
      e[k] += h;
      const double up = loss(p);
      e[k] -= 2 * h;
      const double down = loss(p);
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(gi.data_ptr<double>()[k], fd, 1e-6 * (1 + std::abs(fd)))
          << "d" << kArgNames[i] << "[" << k << "]";
    }
  }
}

// The CUDA kernel equals the reference: fp32 and bf16 y; D = 37 (scalar loads), 64 (warp per
// row), 1536 (Wan 1.3B), 5120 (Wan 14B), 9000 (512 threads x 8 chunks), 9001 (scalar fallback),
// 20000 (vector fallback); gate / shift / scale as strided chunks of one [B, 6, D] tensor.
TEST(ResidualLayerNorm, CudaForwardMatchesReference) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 100;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (int64_t D : {37, 64, 1536, 5120, 9000, 9001, 20000}) {
      double worst = 0;
      for (const Combo& c : kCombos) {
        const Args a = make_args(2, 3, D, c, dt, seed++);
        const ResidualNorm ref = run(residual_layernorm_reference, a);
        Args d = to_device(a, dev);
        const at::Tensor zero = at::zeros({2, 1, D});
        const auto pick = [&](Arg i) { return a[i].defined() ? a[i] : zero; };
        const auto mod = at::cat({zero, zero, pick(kGate), pick(kShift), pick(kScale), zero}, 1)
                             .to(dev)
                             .chunk(6, 1);
        if (c.gate) d[kGate] = mod[2];
        if (c.modulate) {
          d[kShift] = mod[3];
          d[kScale] = mod[4];
        }
        const ResidualNorm o = run(residual_layernorm_fused, d);
        ASSERT_TRUE(o.residual.is_cuda() && o.out.is_cuda()) << name(c, D, dt);
        ASSERT_EQ(o.out.scalar_type(), at::kFloat) << name(c, D, dt);
        EXPECT_TRUE(close(o.residual, ref.residual, 1e-5, 1e-5)) << name(c, D, dt) << " r";
        EXPECT_TRUE(close(o.out, ref.out, 2e-5, 2e-5)) << name(c, D, dt) << " out";
        worst = std::max({worst, max_abs_diff(o.residual, ref.residual),
                          max_abs_diff(o.out, ref.out)});
      }
      std::printf("LNM_MAXERR residual_layernorm_fwd_%s_D%lld %.3e\n",
                  dt == at::kBFloat16 ? "bf16" : "fp32", static_cast<long long>(D), worst);
    }
}

// x and y one element past an aligned address: contiguous, but the kernel must take scalar loads.
TEST(ResidualLayerNorm, CudaMisalignedInputsMatchReference) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 200;
  double worst = 0;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (int64_t D : {64, 1536}) {
      const Args a = make_args(2, 3, D, kAll, dt, seed++);
      const ResidualNorm ref = run(residual_layernorm_reference, a);
      Args d = to_device(a, dev);
      for (Arg i : {kX, kY}) {
        const int64_t n = a[i].numel();
        at::Tensor buf = at::zeros({n + 1}, a[i].options().device(dev));
        d[i] = buf.narrow(0, 1, n).view(a[i].sizes());
        d[i].copy_(a[i].to(dev));
      }
      const ResidualNorm o = run(residual_layernorm_fused, d);
      EXPECT_TRUE(close(o.residual, ref.residual, 1e-5, 1e-5)) << name(kAll, D, dt) << " r";
      EXPECT_TRUE(close(o.out, ref.out, 2e-5, 2e-5)) << name(kAll, D, dt) << " out";
      worst = std::max({worst, max_abs_diff(o.residual, ref.residual),
                        max_abs_diff(o.out, ref.out)});
    }
  std::printf("LNM_MAXERR residual_layernorm_fwd_misaligned %.3e\n", worst);
}

// Gradients of both outputs through the fused op's autograd equal the composite's, on the same
// CUDA inputs, with gate / shift / scale chunks of one leaf as in the DiT block.
TEST(ResidualLayerNorm, CudaGradientsMatchComposite) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  uint64_t seed = 300;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (const Combo& c : kCombos) {
      double worst = 0;
      for (int64_t D : {37, 64, 1536}) {
        const Args a = to_device(make_args(2, 17, D, c, dt, seed++), dev);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1000);
        const at::Tensor g_r = at::randn({2, 17, D}, gen).to(dev);
        const at::Tensor g_out = at::randn({2, 17, D}, gen).to(dev);
        const Args gf = grads_of(residual_layernorm_fused, a, g_r, g_out, /*chunked=*/true);
        const Args ga = grads_of(residual_layernorm_composite, a, g_r, g_out, /*chunked=*/true);
        for (int i = 0; i < kNumArgs; ++i) {
          if (!a[i].defined()) continue;
          EXPECT_EQ(gf[i].scalar_type(), a[i].scalar_type()) << name(c, D, dt) << " d" << kArgNames[i];
          // grad_y of a bf16 y is rounded to bf16 by both paths: allow a couple of bf16 ulps.
          const bool bf16 = gf[i].scalar_type() == at::kBFloat16;
          const double tol = bf16 ? 2e-2 : 1e-4;
          EXPECT_TRUE(close(gf[i], ga[i], tol, tol)) << name(c, D, dt) << " d" << kArgNames[i];
          if (!bf16) worst = std::max(worst, max_abs_diff(gf[i], ga[i]));
        }
      }
      std::printf("LNM_MAXERR residual_layernorm_grad_%s_%s %.3e\n", c.name,
                  dt == at::kBFloat16 ? "bf16" : "fp32", worst);
    }
}

// Only one output used (the other's grad is undefined), and frozen operands (no grad wanted).
TEST(ResidualLayerNorm, CudaPartialGradients) {
  if (!cuda_ready()) GTEST_SKIP() << kSkipMessage;
  const at::Device dev(at::kCUDA, 0);
  const Args a = to_device(make_args(2, 5, 64, kAll, at::kFloat, 400), dev);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(401);
  const at::Tensor g = at::randn({2, 5, 64}, gen).to(dev);
  double worst = 0;
  for (int which = 0; which < 2; ++which) {  // out only, r only
    const at::Tensor g_r = which == 1 ? g : at::Tensor();
    const at::Tensor g_out = which == 0 ? g : at::Tensor();
    const Args gf = grads_of(residual_layernorm_fused, a, g_r, g_out);
    const Args ga = grads_of(residual_layernorm_composite, a, g_r, g_out);
    for (int i = 0; i < kNumArgs; ++i) {
      EXPECT_TRUE(close(gf[i], ga[i], 1e-4, 1e-4)) << "output " << which << " d" << kArgNames[i];
      worst = std::max(worst, max_abs_diff(gf[i], ga[i]));
    }
  }
  // Only x wants a gradient: everything else is frozen.
  at::Tensor x = a[kX].detach().clone().requires_grad_(true);
  const ResidualNorm o =
      residual_layernorm_fused(x, a[kY], a[kGate], a[kWeight], a[kBias], a[kShift], a[kScale], kEps);
  const at::Tensor gx = torch::autograd::grad({(o.out * g).sum()}, {x})[0];
  const Args ga = grads_of(residual_layernorm_composite, a, {}, g);
  EXPECT_TRUE(close(gx, ga[kX], 1e-4, 1e-4)) << "frozen operands dx";
  worst = std::max(worst, max_abs_diff(gx, ga[kX]));
  std::printf("LNM_MAXERR residual_layernorm_grad_partial %.3e\n", worst);
}

}  // namespace vidit
