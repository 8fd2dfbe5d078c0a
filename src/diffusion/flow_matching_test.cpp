#include "diffusion/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "diffusion/sampler.h"

namespace vidit {
namespace {

TEST(FlowMatching, TargetConvention) {
  at::Tensor x0 = at::randn({3, 2, 5}), noise = at::randn({3, 2, 5}), sigma = at::tensor({0.0f, 0.25f, 1.0f});
  FlowSample s = make_flow_sample(x0, noise, sigma);
  EXPECT_TRUE(at::allclose(s.x_t[0], x0[0]));                 // sigma 0: clean
  EXPECT_TRUE(at::allclose(s.x_t[2], noise[2]));              // sigma 1: pure noise
  EXPECT_TRUE(at::allclose(s.x_t[1], 0.75 * x0[1] + 0.25 * noise[1]));
  EXPECT_TRUE(at::allclose(s.target, noise - x0));            // v = eps - x0
  EXPECT_TRUE(at::allclose(s.timestep, at::tensor({0.0f, 250.0f, 1000.0f})));
  // d x_t / d sigma equals the target: moving along v goes from data to noise.
  FlowSample s2 = make_flow_sample(x0, noise, sigma + 1e-3);
  EXPECT_TRUE(at::allclose((s2.x_t - s.x_t) / 1e-3, s.target, 1e-2, 1e-2));
}

TEST(FlowMatching, ShiftAndSigmaDistributions) {
  at::Tensor s = at::tensor({0.0, 0.5, 1.0}, at::kDouble);
  EXPECT_TRUE(at::allclose(shift_sigma(s, 3.0), at::tensor({0.0, 0.75, 1.0}, at::kDouble)));
  EXPECT_TRUE(at::allclose(shift_sigma(s, 1.0), s));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  DiffusionConfig c;
  c.shift = 1.0;
  c.timestep_sampling = TimestepSampling::uniform;
  at::Tensor u = sample_sigmas(20000, c, gen);
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.01);
  c.timestep_sampling = TimestepSampling::logit_normal;
  c.logit_mean = 1.0;
  at::Tensor ln = sample_sigmas(20000, c, gen);
  EXPECT_GT(ln.min().item<double>(), 0.0);
  EXPECT_LT(ln.max().item<double>(), 1.0);
  EXPECT_NEAR(at::logit(ln).mean().item<double>(), 1.0, 0.03);  // logit of a logit-normal is normal
  c.shift = 3.0;
  EXPECT_GT(sample_sigmas(20000, c, gen).mean().item<double>(), ln.mean().item<double>());
}

TEST(FlowMatching, TextDropout) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  at::Tensor text = at::ones({1000, 2, 3}), null = at::zeros({2, 3});
  at::Tensor out = drop_text(text, null, 0.3, gen);
  const double dropped = (out.sum(at::IntArrayRef{1, 2}) == 0).to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(dropped, 0.3, 0.05);
  EXPECT_TRUE(at::equal(drop_text(text, null, 0.0, gen), text));
}

TEST(EulerSampler, IntegratesLinearFieldToData) {
  // For data x0 and the straight path x_sigma = (1 - sigma) x0 + sigma x1, the exact velocity
  // is v = x1 - x0 = (x - x0) / sigma. Euler along it must land on x0 (any shift).
  at::Tensor x0 = at::randn({2, 3, 4}, at::kDouble), x1 = at::randn({2, 3, 4}, at::kDouble);
  auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
    at::Tensor sig = (t.to(at::kDouble) / 1000.0).view({-1, 1, 1});
    return (x - x0) / sig;
  };
  at::Tensor text = at::zeros({2, 1, 1});
  for (double shift : {1.0, 3.0}) {
    at::Tensor out = euler_sample(field, x1, text, at::zeros({1, 1}), {20, shift, 1.0});
    EXPECT_TRUE(at::allclose(out, x0, 1e-6, 1e-6)) << "shift " << shift;
  }
  // A field that does not depend on x (constant velocity c): x(0) = x1 - c exactly.
  at::Tensor c = at::randn({2, 3, 4}, at::kDouble);
  auto constant = [&](const at::Tensor&, const at::Tensor&, const at::Tensor&) { return c; };
  EXPECT_TRUE(at::allclose(euler_sample(constant, x1, text, at::zeros({1, 1}), {7, 2.0, 1.0}), x1 - c));
}

TEST(EulerSampler, ClassifierFreeGuidanceMixesBranches) {
  // v_text = 1, v_null = 0 everywhere: guided velocity is cfg_scale; x(0) = x1 - cfg_scale.
  auto field = [&](const at::Tensor& x, const at::Tensor&, const at::Tensor& text) {
    return text.sum(at::IntArrayRef{1, 2}).view({-1, 1}).expand_as(x).to(x.scalar_type());
  };
  at::Tensor x1 = at::zeros({2, 5}, at::kDouble);
  at::Tensor text = at::ones({2, 1, 1}), null = at::zeros({1, 1});
  at::Tensor out = euler_sample(field, x1, text, null, {10, 1.0, 4.0});
  EXPECT_TRUE(at::allclose(out, at::full({2, 5}, -4.0, at::kDouble)));
  EXPECT_EQ(euler_sigmas(4, 1.0).size(0), 5);
  EXPECT_DOUBLE_EQ(euler_sigmas(4, 3.0)[0].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(euler_sigmas(4, 3.0)[4].item<double>(), 0.0);
}

}  // namespace
}  // namespace vidit
