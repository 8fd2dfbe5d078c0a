// FP8 projections against their reference (the recipe of model/fp8.h written out in fp64 from
// the same quantised operands), per scaling and input dtype, forward and backward; the error
// FP8 adds against full precision; casts reused within a step change nothing; and the attention
// kernel a run pins, asked of ATen. (Training in FP8 is tested in src/train/fp8_training_test.cpp.)
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/precision.h"
#include "model/attention_backend.h"
#include "model/dit.h"
#include "model/fp8.h"

namespace vidit {
namespace {

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

double max_rel(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(Fp8, CastKeepsTheLargestValueAndThreeMantissaBits) {
  torch::manual_seed(0);
  at::Tensor t = at::randn({8, 64}) * at::logspace(-4, 2, 8).unsqueeze(1);  // rows of very different size
  for (bool rowwise : {false, true}) {
    const Fp8Tensor q = to_fp8(t, at::kFloat8_e4m3fn, rowwise);
    EXPECT_EQ(q.data.scalar_type(), at::kFloat8_e4m3fn);
    EXPECT_EQ(q.scale.numel(), rowwise ? 8 : 1);
    // The largest magnitude lands on 448 (per row in the rowwise recipe).
    const at::Tensor top = q.data.to(at::kFloat).abs().amax(rowwise ? at::IntArrayRef{1} : at::IntArrayRef{0, 1});
    EXPECT_TRUE(at::allclose(top, at::full_like(top, kE4M3Max))) << top;
    // Values near their scale's top keep 3 mantissa bits: relative error at most 2^-4.
    const at::Tensor back = from_fp8(q), big = t.abs() > (rowwise ? t.abs().amax(1, true) : t.abs().amax()) / 8;
    const double err = ((back - t).abs() / t.abs()).masked_select(big).max().item<double>();
    EXPECT_LE(err, 1.0 / 16) << (rowwise ? "rowwise" : "tensorwise");
  }
  // One scale for all rows loses the small rows; one per row does not.
  const at::Tensor small = t.select(0, 0);
  EXPECT_GT(rel_err(from_fp8(to_fp8(t, at::kFloat8_e4m3fn, false)).select(0, 0), small), 0.5);
  EXPECT_LT(rel_err(from_fp8(to_fp8(t, at::kFloat8_e4m3fn, true)).select(0, 0), small), 0.05);
}

struct Case {
  bool rowwise;
  at::ScalarType dtype;
};

class Fp8Linear : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Linear, ForwardAndGradientsMatchTheReference) {
  const Case c = GetParam();
  torch::manual_seed(1);
  // 2 x 37 tokens: not a multiple of 16 (dW pads them).
  const at::Tensor x = at::randn({2, 37, 64}).to(c.dtype).requires_grad_(true);
  const at::Tensor w = (at::randn({48, 64}) * 0.1).requires_grad_(true), b = at::randn({48}).requires_grad_(true);
  const at::Tensor y = fp8_linear(x, w, b, c.rowwise);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 37, 48}));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor dy = at::randn({2, 37, 48});
  y.backward(dy.to(y.scalar_type()));
  const Fp8Reference r = fp8_linear_reference(x.detach(), w.detach(), b.detach(), dy.to(at::kBFloat16), c.rowwise);
  // The products come out in bf16: 2^-8 relative, and a little more where sums cancel.
  EXPECT_LE(max_rel(y.reshape({-1, 48}), r.y), 1e-2);
  EXPECT_LE(max_rel(x.grad().reshape({-1, 64}), r.dx), 1e-2);
  EXPECT_LE(max_rel(w.grad(), r.dw), 1e-2);
  EXPECT_LE(max_rel(b.grad(), r.db), 1e-3);
  EXPECT_EQ(x.grad().scalar_type(), c.dtype);
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  // And the whole stays near the unquantised product: FP8's own error, a few percent.
  const at::Tensor exact = at::linear(x.detach().to(at::kDouble), w.detach().to(at::kDouble), b.detach().to(at::kDouble));
  EXPECT_LE(rel_err(y.detach().to(at::kDouble), exact), 0.08);
  const at::Tensor exact_dw = at::matmul(dy.reshape({-1, 48}).t().to(at::kDouble), x.detach().reshape({-1, 64}).to(at::kDouble));
  EXPECT_LE(rel_err(w.grad().to(at::kDouble), exact_dw), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Scalings, Fp8Linear,
                         ::testing::Values(Case{false, at::kFloat}, Case{true, at::kFloat}, Case{false, at::kBFloat16},
                                           Case{true, at::kBFloat16}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.rowwise ? "Rowwise" : "Tensorwise") +
                                  (i.param.dtype == at::kFloat ? "Fp32" : "Bf16");
                         });

// A weight handed over already in e4m3 (as FSDP gathers it) gives the product and gradients of
// casting the weight there, bit for bit, without reading the weight's values.
TEST(Fp8, AGivenE4m3WeightIsTheWeightsOwnCast) {
  for (bool rowwise : {false, true}) {
    torch::manual_seed(3);
    const at::Tensor x0 = at::randn({3, 21, 64}), w0 = at::randn({32, 64}) * 0.1, b0 = at::randn({32});
    const at::Tensor dy = at::randn({3, 21, 32}).to(at::kBFloat16);
    auto run = [&](const at::Tensor& w_values, const Fp8Tensor* w8) {
      const at::Tensor x = x0.clone().requires_grad_(true), w = w_values.clone().requires_grad_(true),
                       b = b0.clone().requires_grad_(true);
      const at::Tensor y = fp8_linear(x, w, b, rowwise, false, w8);
      y.backward(dy);
      return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
    };
    const Fp8Tensor w8 = to_fp8(w0, at::kFloat8_e4m3fn, rowwise);
    const std::vector<at::Tensor> own = run(w0, nullptr), given = run(at::full_like(w0, 7.0), &w8);
    for (size_t i = 0; i < own.size(); ++i)
      EXPECT_TRUE(at::equal(own[i], given[i])) << (rowwise ? "rowwise" : "tensorwise") << ", output " << i;
  }
}

// train.fp8_fast_accum reaches _scaled_mm's use_fast_accum in the forward: the CPU kernel
// accumulates the same way in both modes, so the product is unchanged here.
TEST(Fp8, FastAccumulationRunsTheForward) {
  torch::manual_seed(4);
  const at::Tensor x = at::randn({16, 64}), w = at::randn({32, 64}) * 0.1;
  const at::Tensor slow = fp8_linear(x, w, at::Tensor(), false, false), fast = fp8_linear(x, w, at::Tensor(), false, true);
  EXPECT_LE(max_rel(fast, slow.to(at::kDouble)), 1e-2);
}

TEST(Fp8, ProjectionWeightsAreNamedByTheRule) {
  EXPECT_TRUE(fp8_projection_weight("blocks.0.self_attn.q.weight"));
  EXPECT_TRUE(fp8_projection_weight("blocks.12.cross_attn.o.weight"));
  EXPECT_TRUE(fp8_projection_weight("blocks.3.ffn.0.weight"));
  EXPECT_TRUE(fp8_projection_weight("blocks.3.ffn.2.weight"));
  EXPECT_FALSE(fp8_projection_weight("blocks.3.ffn.2.bias"));
  EXPECT_FALSE(fp8_projection_weight("blocks.0.self_attn.norm_q.weight"));
  EXPECT_FALSE(fp8_projection_weight("blocks.0.modulation"));
  EXPECT_FALSE(fp8_projection_weight("head.linear.weight"));
  EXPECT_FALSE(fp8_projection_weight("patch_embed.weight"));
}

TEST(Fp8, NarrowProjectionsStayInHigherPrecision) {
  EXPECT_TRUE(fp8_eligible(64, 48));
  EXPECT_FALSE(fp8_eligible(64, 40));  // a tensor-parallel shard of 40 features
  const at::Tensor x = at::randn({5, 24}), w = at::randn({32, 24}), b = at::randn({32});
  EXPECT_TRUE(at::equal(fp8_linear(x, w, b, false), at::linear(x, w, b)));
}

// Every projection inside the blocks, and only those, multiplies in FP8.
TEST(Fp8, ApplyInstallsItInTheBlocksOnly) {
  const Config c = test::tiny_config();
  DiT model(c.model);
  EXPECT_EQ(apply_fp8(*model, Precision::bf16), 0);
  EXPECT_FALSE(model->blocks->ptr<DiTBlockImpl>(0)->linear_fn);
  EXPECT_EQ(apply_fp8(*model, Precision::fp8), 10 * c.model.layers);
  auto& block = *model->blocks->ptr<DiTBlockImpl>(1);
  EXPECT_TRUE(block.linear_fn && block.self_attn->linear_fn && block.cross_attn->linear_fn);
  // The block's output in FP8 stays near its output in bf16.
  torch::manual_seed(2);
  const at::Tensor x = at::randn({2, 4, 2, 4, 4}), t = at::rand({2}) * 1000, text = at::randn({2, 4, 8});
  at::Tensor y8 = model->forward(x, t, text);
  DiT plain(c.model);
  plain->to(at::kCPU);
  for (size_t i = 0; i < plain->parameters().size(); ++i)
    plain->parameters()[i].detach().copy_(model->parameters()[i].detach());
  EXPECT_LE(rel_err(y8.to(at::kDouble), plain->forward(x, t, text).to(at::kDouble)), 0.1);
}

// Reused casts (train.fp8_reuse_casts): with every block recomputed, a step casts each FP8
// weight once (not in the forward, the recomputed forward and backward) and self-attention's q,
// k, v one input; the losses and gradients are bitwise those of casting at every use, step after
// step, as long as the casts are cleared when the weights change. A cast kept across an update
// would be stale: the output then differs.
TEST(Fp8, ReusedCastsCastEachWeightOnceAStepAndChangeNothing) {
  at::set_num_threads(1);
  const Config c = test::tiny_config();
  const int64_t layers = c.model.layers, projections = 10 * layers;
  auto make = [&](std::shared_ptr<Fp8Casts> casts) {
    torch::manual_seed(3);
    DiT model(c.model);
    model->init_weights();
    torch::NoGradGuard ng;
    model->head->head->weight.normal_(0, 0.1);  // (zero at init: no gradient would reach the blocks)
    EXPECT_EQ(apply_fp8(*model, Precision::fp8_rowwise, true, std::move(casts)), projections);
    model->recompute_blocks = -1;
    return model;
  };
  auto casts = std::make_shared<Fp8Casts>();
  DiT reused = make(casts), plain = make(nullptr);
  torch::manual_seed(4);
  const at::Tensor x = at::randn({2, 4, 2, 4, 4}), t = at::rand({2}) * 1000, text = at::randn({2, 4, 8});
  auto forward = [&](DiT& m) {
    AutocastGuard autocast(Precision::fp8_rowwise, at::kCPU);
    return m->forward(x, t, text);
  };
  for (int step = 0; step < 3; ++step) {
    casts->clear();
    const Fp8Casts before = *casts;
    at::Tensor a, b;
    for (DiT* m : {&reused, &plain}) {
      (*m)->zero_grad();
      at::Tensor y = forward(*m);
      (m == &reused ? a : b) = y.detach();
      (y.to(at::kFloat).pow(2).mean()).backward();
    }
    EXPECT_TRUE(at::equal(a, b)) << "step " << step;
    const auto pa = reused->named_parameters(), pb = plain->named_parameters();
    for (const auto& item : pa) {
      const at::Tensor& ga = item.value().grad();
      const at::Tensor& gb = pb[item.key()].grad();
      ASSERT_EQ(ga.defined(), gb.defined()) << item.key();
      if (ga.defined()) EXPECT_TRUE(at::equal(ga, gb)) << "step " << step << " " << item.key();
    }
    // Once per weight; the recomputed forward reads them again. Per block and forward: self-
    // attention casts one input for q, k, v and one for o, cross-attention q, one for k and v,
    // and o, the MLP two: 7 casts, 3 reuses.
    EXPECT_EQ(casts->weight_casts - before.weight_casts, projections) << "step " << step;
    EXPECT_EQ(casts->weight_reuses - before.weight_reuses, projections) << "step " << step;
    EXPECT_EQ(casts->input_casts - before.input_casts, 2 * 7 * layers) << "step " << step;
    EXPECT_EQ(casts->input_reuses - before.input_reuses, 2 * 3 * layers) << "step " << step;
    // The same update to both.
    torch::NoGradGuard ng;
    for (const auto& item : pa)
      if (item.value().grad().defined()) {
        item.value().sub_(item.value().grad(), 0.5);
        pb[item.key()].sub_(pb[item.key()].grad(), 0.5);
      }
  }
  // Not cleared after the last update: the casts kept are of the old weights.
  casts->clear();
  {
    torch::NoGradGuard ng;
    forward(reused);  // casts the weights as they are
    for (const auto& item : reused->named_parameters())
      if (fp8_projection_weight(item.key())) item.value().mul_(1.5), plain->named_parameters()[item.key()].mul_(1.5);
    EXPECT_FALSE(at::equal(forward(reused), forward(plain))) << "a stale cast would go unnoticed";
    casts->clear();
    EXPECT_TRUE(at::equal(forward(reused), forward(plain)));
  }
}

// A pinned kernel is the one ATen runs; one the device lacks is an error naming the key.
TEST(AttentionBackend, APinnedKernelIsTheOneThatRuns) {
  const at::Device cpu(at::kCPU);
  select_attention_backend(AttentionBackend::math, cpu);
  EXPECT_EQ(attention_backend_for(1, 2, 64, 16, at::kFloat, cpu), "math");
  select_attention_backend(AttentionBackend::flash, cpu);
  EXPECT_EQ(attention_backend_for(1, 2, 64, 16, at::kFloat, cpu), "flash");
  select_attention_backend(AttentionBackend::automatic, cpu);
  const std::string picked = attention_backend_for(1, 2, 64, 16, at::kFloat, cpu);
  EXPECT_TRUE(picked == "flash" || picked == "math") << picked;
  try {
    select_attention_backend(AttentionBackend::cudnn, cpu);
    ADD_FAILURE() << "cudnn on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.attention_backend"), std::string::npos) << e.what();
  }
  select_attention_backend(AttentionBackend::automatic, cpu);
}

}  // namespace
}  // namespace vidit
