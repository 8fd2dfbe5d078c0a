// The step-time model's accounting: its FLOPs are model_info's, split over the ranks that share a
// sample's work; recomputation and communication add what they cost; measured rates are real.
// (Predictions against measured steps: bench/bench_step_time.cpp, docs/BENCHMARKS.md.)
#include "parallel/step_time.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/model_info.h"

namespace vidit {
namespace {

TEST(StepTime, FlopsAreTheModelsSplitOverTheRanksThatShareASample) {
  Config c = test::tiny_config({"train.batch_size=4", "train.grad_accum=2"});
  const DeviceRates r{1e12, 5e11, 1e11, 1e10, 2e12, "test"};
  const StepTimePrediction one = predict_step_time(c, plan_step(c), r);
  const double per_sample = model_info(c).train_flops;
  EXPECT_NEAR(one.model_flops, 8 * per_sample, 1e-6 * per_sample);
  EXPECT_NEAR(one.matmul_flops + one.attention_flops, one.model_flops, 1e-9 * one.model_flops);
  EXPECT_DOUBLE_EQ(one.matmul_s, one.matmul_flops / 1e12);
  EXPECT_DOUBLE_EQ(one.attention_s, one.attention_flops / 5e11);
  EXPECT_EQ(one.comm_s, 0.0);  // alone: nothing sent
  EXPECT_DOUBLE_EQ(one.mfu(one.serial_s(), 2e12), one.model_flops / one.serial_s() / 2e12);

  Config dp = test::tiny_config({"train.batch_size=4", "train.grad_accum=2", "parallel.replicate=2", "parallel.ulysses=2"});
  const StepPlan plan = plan_step(dp);
  const StepTimePrediction four = predict_step_time(dp, plan, r);
  EXPECT_NEAR(four.model_flops, one.model_flops / 4, 1e-6 * one.model_flops);  // half the samples, half of each
  EXPECT_GT(four.comm_bytes, 0.0);
  EXPECT_DOUBLE_EQ(four.comm_s, plan.comm() / 1e10);
  EXPECT_DOUBLE_EQ(four.overlapped_s(), std::max(four.compute_s(), four.comm_s));
  EXPECT_DOUBLE_EQ(four.serial_s(), four.compute_s() + four.comm_s);
}

TEST(StepTime, RecomputationAddsAForwardButNoModelFlops) {
  Config c = test::tiny_config();
  Config rc = test::tiny_config({"train.recompute_blocks=-1"});
  const DeviceRates r{1e12, 1e12, 1e11, 0, 0, "test"};
  const StepTimePrediction plain = predict_step_time(c, plan_step(c), r), again = predict_step_time(rc, plan_step(rc), r);
  EXPECT_EQ(again.model_flops, plain.model_flops);
  EXPECT_GT(again.matmul_flops + again.attention_flops, plain.matmul_flops + plain.attention_flops);
  EXPECT_LT(again.matmul_flops + again.attention_flops, 1.34 * (plain.matmul_flops + plain.attention_flops));
  EXPECT_GT(again.elementwise_bytes, plain.elementwise_bytes);
}

TEST(StepTime, MeasuredCpuRatesArePositiveAndOrdered) {
  Config c = test::tiny_config({"model.dim=128", "model.ffn_dim=256", "train.threads=1"});
  const DeviceRates r = measure_rates(c, "cpu");
  EXPECT_GT(r.matmul_flops, 1e8);   // any CPU does 0.1 GFLOP/s
  EXPECT_LT(r.matmul_flops, 1e13);  // and no CPU thread does 10 TFLOP/s
  EXPECT_GT(r.attention_flops, 0.0);
  EXPECT_GT(r.memory_bytes, 1e8);
  EXPECT_EQ(r.peak_flops, 0.0);  // unknown for a CPU unless train.peak_tflops says
  EXPECT_THROW(measure_rates(c, "tpu"), Error);
}

}  // namespace
}  // namespace vidit
