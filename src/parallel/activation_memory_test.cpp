// A block's activations measured on the CPU, and on a GPU where one is present
// (parallel/activation_memory.h), predict what a model of other depth and token count holds
// between forward and backward, for each policy and precision; and the plan and the memory
// budget's choice use them in place of the formula.
#include "parallel/activation_memory.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdio>
#include <tuple>

#include "../../tests/test_util.h"
#include "core/device_memory.h"
#include "core/precision.h"
#include "model/dit.h"
#include "model/fp8.h"
#include "parallel/plan.h"

namespace vidit {
namespace {

Config config(Precision precision) {
  Config c = test::tiny_config({"model.layers=3", "model.dim=128", "model.ffn_dim=384", "model.heads=4",
                                "model.text_len=16", "data.latent_frames=4", "data.latent_height=16",
                                "data.latent_width=32", "train.batch_size=2"});
  c.train.precision = precision;
  return c;
}

// What `layers` blocks of the config's model hold on `device` after a forward of two samples of
// 512 tokens (the CUDA caching allocator's bytes on a GPU, the heap's on the CPU).
double held(const Config& cfg, int64_t layers, int64_t whole, int64_t selective, const at::Device& device = at::kCPU) {
  ModelConfig mc = cfg.model;
  mc.layers = layers;
  torch::manual_seed(1);
  DiT model(mc);
  model->init_weights();
  model->to(device);
  apply_fp8(*model, cfg.train.precision, cfg.train.fp8_fast_accum);
  model->recompute_blocks = whole;
  model->selective_blocks = selective;
  const at::Tensor x = at::randn({2, mc.in_channels, 4, 16, 32}).to(device),
                   t = at::tensor({100.0f, 700.0f}).to(device), text = at::randn({2, mc.text_len, mc.text_dim}).to(device);
  auto now = [&] { return device.is_cuda() ? cuda_allocated_bytes(device.index()) : host_heap_bytes(); };
  double during = 0;
  for (int rep = 0; rep < 2; ++rep) {  // the first forward builds lazy state
    const int64_t before = now();
    AutocastGuard autocast(cfg.train.precision, device.type());
    at::Tensor out = model->forward(x, t, text);
    during = double(now() - before);
  }
  return during;
}

TEST(ActivationMemory, AMeasuredBlockPredictsWhatADeeperModelHolds) {
  at::set_num_threads(1);
  double keep_fp32 = 0;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const Config cfg = config(p);
    const BlockActivations a = measure_block_activations(cfg, at::kCPU);
    EXPECT_NE(a.source.find("cpu"), std::string::npos) << a.source;
    const double tokens = 4.0 * 8 * 16;  // 512 per sample
    struct Case {
      const char* name;
      BlockActivations::Line line;
      int64_t whole, selective;
    };
    for (const Case& c : {Case{"keep", a.keep, 0, 0}, Case{"selective", a.selective, 0, -1}, Case{"whole", a.whole, -1, 0}}) {
      // Two more blocks (3 against 1), two samples of 512 tokens: the measurement was of one
      // sample of 256, 512 and 768 tokens and two of 256.
      const double measured = held(cfg, 3, c.whole, c.selective) - held(cfg, 1, c.whole, c.selective);
      const double predicted = 2 * c.line.bytes(2, tokens);
      std::printf("%s %s: a block holds %.0f B per token, %.4f per pair, %.0f per sample, %.0f per forward; 2 blocks "
                  "x 2 samples: %.3f MB predicted, %.3f MB held\n",
                  name_of(p).c_str(), c.name, c.line.per_token, c.line.per_pair, c.line.per_sample, c.line.per_forward,
                  predicted / 1e6, measured / 1e6);
      EXPECT_NEAR(measured, predicted, 0.05 * predicted) << name_of(p) << " " << c.name;
    }
    // A block recomputed whole keeps its input, one [L, dim] fp32 value per token; the selective
    // policy more, keeping everything most.
    EXPECT_NEAR(a.whole.per_token, 4.0 * 128, 0.1 * 4 * 128) << name_of(p);
    EXPECT_GT(a.selective.per_token, 2 * a.whole.per_token) << name_of(p);
    EXPECT_GT(a.keep.per_token, 2 * a.selective.per_token) << name_of(p);
    if (p == Precision::fp32) {
      keep_fp32 = a.keep.per_token;
      // The plan's formula, (18 dim + 2 ffn) floats per token, is about what ATen's chain keeps in fp32.
      EXPECT_NEAR(a.keep.per_token, (18.0 * 128 + 2 * 384) * 4, 0.25 * (18.0 * 128 + 2 * 384) * 4);
      EXPECT_LT(a.keep.per_forward, 0.05 * a.keep.bytes(1, tokens)) << "nothing but activations";
    } else {
      EXPECT_LT(a.keep.per_token, 0.95 * keep_fp32) << "bf16 autocast keeps bf16 copies";
      // ... and a bf16 copy of each of the block's weights (its linear layers' backward keeps it):
      // about once, not missing and not twice (measured 1.25-1.26x of the weights' bf16 bytes;
      // the rest of the intercept varies with the heap from run to run).
      const ModelConfig& mc = cfg.model;
      const double d = double(mc.dim), weights = 8 * d * d + 2 * d * double(mc.ffn_dim);
      EXPECT_NEAR(a.keep.per_forward, 2 * weights, 0.35 * 2 * weights);
    }
  }
}

TEST(ActivationMemory, ThePlanAndTheBudgetUseTheMeasuredFigures) {
  Config cfg = config(Precision::bf16);
  BlockActivations a;
  a.keep = {10000, 5000};
  a.selective = {2000, 1000};
  a.whole = {500, 0};
  const double b = 2, L = double(tokens_per_sample(cfg));
  const StepPlan none = plan_step(cfg, RecomputeCounts{0, 0}, &a);
  EXPECT_TRUE(none.measured_activations);
  EXPECT_DOUBLE_EQ(none.activations, 3 * a.keep.bytes(b, L));
  const StepPlan mixed = plan_step(cfg, RecomputeCounts{1, 1}, &a);
  // One block whole, one selective, one keeping all, and one block's whole set while recomputed.
  EXPECT_DOUBLE_EQ(mixed.activations, a.whole.bytes(b, L) + a.selective.bytes(b, L) + 2 * a.keep.bytes(b, L));
  EXPECT_FALSE(plan_step(cfg, RecomputeCounts{0, 0}).measured_activations);
  EXPECT_NE(format_plan(cfg, none).find("measured"), std::string::npos);

  // A budget that fits the formula's figure with nothing recomputed, but not measured blocks
  // that hold twice as much: the measured figures choose recomputation.
  cfg.train.memory_budget_gb = (plan_step(cfg, RecomputeCounts{0, 0}).memory() + 1) / double(1ll << 30);
  const RecomputeCounts by_formula = recompute_counts(cfg);
  EXPECT_EQ(by_formula.whole + by_formula.selective, 0);
  BlockActivations heavy = a;
  heavy.keep.per_token = 2 * (plan_step(cfg, RecomputeCounts{0, 0}).activations / 3 / (b * L));
  const RecomputeCounts by_measure = recompute_counts(cfg, &heavy);
  EXPECT_GT(by_measure.whole + by_measure.selective, 0);
  EXPECT_LE(plan_step(cfg, by_measure, &heavy).memory(), cfg.train.memory_budget_gb * double(1ll << 30));
}

// On a GPU the fused kernels, flash attention (no L x L weights kept) and FP8 layers hold other
// amounts than ATen's CPU chain: the measurement on the device predicts, from the CUDA caching
// allocator, what two more blocks hold with two samples of 512 tokens, in bf16 and in FP8.
TEST(ActivationMemoryCuda, AMeasuredBlockPredictsWhatADeeperModelHoldsOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  for (Precision p : {Precision::bf16, Precision::fp8}) {
    const Config cfg = config(p);
    const BlockActivations a = measure_block_activations(cfg, gpu);
    EXPECT_NE(a.source.find("cuda"), std::string::npos) << a.source;
    const double tokens = 4.0 * 8 * 16;
    for (auto [name, line, whole, selective] :
         {std::tuple{"keep", a.keep, 0, 0}, std::tuple{"selective", a.selective, 0, -1}, std::tuple{"whole", a.whole, -1, 0}}) {
      const double measured = held(cfg, 3, whole, selective, gpu) - held(cfg, 1, whole, selective, gpu);
      const double predicted = 2 * line.bytes(2, tokens);
      std::printf("GPU_PARITY activations_%s_%s %.4f (a block: %.0f B per token, %.4f per pair, %.0f per sample, %.0f "
                  "per forward; %.3f MB predicted, %.3f MB held)\n",
                  name_of(p).c_str(), name, std::abs(measured - predicted) / predicted, line.per_token, line.per_pair,
                  line.per_sample, line.per_forward, predicted / 1e6, measured / 1e6);
      EXPECT_NEAR(measured, predicted, 0.05 * predicted) << name_of(p) << " " << name;
    }
    EXPECT_GT(a.keep.per_token, a.selective.per_token) << name_of(p);
    EXPECT_GT(a.selective.per_token, a.whole.per_token) << name_of(p);
  }
}

}  // namespace
}  // namespace vidit
