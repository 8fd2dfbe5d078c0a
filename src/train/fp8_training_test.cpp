// Training in FP8 (model/fp8.h): a fixed batch overfitted under bf16 autocast learns with the
// blocks' projections in FP8 as it does in bf16; the trainer takes train.precision = "fp8" and
// stays near the bf16 run; and reusing the casts within a step (train.fp8_reuse_casts) trains
// bit for bit as casting at every use, with the casts counted by `vidit plan`.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include "../../tests/overfit.h"
#include "../../tests/test_util.h"
#include "core/precision.h"
#include "loader/dataset.h"
#include "model/fp8.h"
#include "parallel/plan.h"
#include "train/trainer.h"

namespace vidit {
namespace {

// A fixed batch overfitted for 200 steps (the flow-matching loss, clipping and AdamW of the
// trainer) under bf16 autocast, with the blocks' projections in bf16 and in FP8: FP8 learns as
// bf16 does.
TEST(Fp8, OverfitsOneBatchAsBf16Does) {
  at::set_num_threads(1);  // as the tiny config's train.threads: one core, beside the other tests
  const Config c = test::tiny_config();
  auto run = [&](Precision precision) { return test::overfit_one_batch(c, precision, 200); };
  const std::vector<double> bf16 = run(Precision::bf16), fp8 = run(Precision::fp8), rowwise = run(Precision::fp8_rowwise);
  auto mean = [](const std::vector<double>& l, size_t from) {
    double s = 0;
    for (size_t i = from; i < l.size(); ++i) s += l[i];
    return s / double(l.size() - from);
  };
  std::printf("loss at steps 1 / 200, mean of steps 1-200: bf16 %.4f / %.4f, %.4f; fp8 %.4f / %.4f, %.4f; fp8_rowwise "
              "%.4f / %.4f, %.4f\n",
              bf16.front(), bf16.back(), mean(bf16, 0), fp8.front(), fp8.back(), mean(fp8, 0), rowwise.front(),
              rowwise.back(), mean(rowwise, 0));
  for (const auto* l : {&bf16, &fp8, &rowwise}) EXPECT_LT(l->back() * 10, l->front());
  EXPECT_LE(std::abs(mean(fp8, 0) - mean(bf16, 0)) / mean(bf16, 0), 0.05);
  EXPECT_LE(std::abs(mean(rowwise, 0) - mean(bf16, 0)) / mean(bf16, 0), 0.05);
  EXPECT_NE(fp8, bf16) << "the FP8 run took the FP8 path";
}

// The trainer takes train.precision = "fp8" (the same seeds: the runs differ by FP8's rounding).
TEST(Fp8, TrainerRunsIt) {
  auto run = [](const std::string& precision) {
    const Config c = test::tiny_config({"train.precision=\"" + precision + "\"", "train.steps=20"});
    Trainer t(c, std::make_shared<SyntheticDataset>(c, 32, 11), at::zeros({c.model.text_len, c.model.text_dim}));
    return t.fit(-1, false);
  };
  const std::vector<double> bf16 = run("bf16"), fp8 = run("fp8_rowwise");
  ASSERT_EQ(fp8.size(), 20u);
  EXPECT_NE(fp8, bf16);
  for (size_t i = 0; i < fp8.size(); ++i) EXPECT_NEAR(fp8[i], bf16[i], 0.02 * bf16[i]) << "step " << i + 1;
}

// The trainer reuses casts by default; with train.fp8_reuse_casts = false it casts at every use:
// the same losses and weights bit for bit over steps of two micro-batches with every block
// recomputed. The plan counts the casts the step holds (1 byte a weight).
TEST(Fp8, TrainerReusingCastsTrainsBitwiseAsCastingAtEveryUse) {
  at::set_num_threads(1);
  auto config = [](bool reuse) {
    return test::tiny_config({"train.precision=\"fp8\"", "train.steps=4", "train.grad_accum=2",
                              "train.recompute_blocks=-1", std::string("train.fp8_reuse_casts=") + (reuse ? "true" : "false")});
  };
  auto run = [](const Config& c) {
    auto t = std::make_unique<Trainer>(c, std::make_shared<SyntheticDataset>(c, 32, 11), at::zeros({c.model.text_len, c.model.text_dim}));
    const std::vector<double> losses = t->fit(-1, false);
    return std::make_pair(losses, std::move(t));
  };
  auto [with, a] = run(config(true));
  auto [without, b] = run(config(false));
  ASSERT_EQ(with.size(), 4u);
  EXPECT_EQ(with, without);
  const auto pb = b->model()->named_parameters();
  for (const auto& item : a->model()->named_parameters())
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  double fp8_weights = 0;
  for (const auto& item : a->model()->named_parameters())
    if (fp8_projection_weight(item.key()) && fp8_eligible(item.value().size(1), item.value().size(0)))
      fp8_weights += double(item.value().numel());
  EXPECT_GT(fp8_weights, 0);
  EXPECT_DOUBLE_EQ(plan_step(config(true)).weights - plan_step(config(false)).weights, fp8_weights);
}

}  // namespace
}  // namespace vidit
