// A training run's TensorBoard files across a crash, read back by TensorBoard's own reader: the
// run is killed by the product's fault injection after step 5 (its checkpoint is at step 4), the
// same command runs again and finishes; every step's loss appears exactly once with the value
// metrics.jsonl has for it, the save times and the config are there, and no step is missing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

#ifndef VIDIT_PYTHON
#define VIDIT_PYTHON "python3"
#endif

TEST(TrainerTensorBoard, EveryStepOnceAcrossAKillAndRestart) {
  test::ScratchDir dir("trainer_tb");
  const std::string out = dir / "run";
  const std::string args = std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out +
                           " train.steps=8 checkpoint.every=4 checkpoint.async=false";
  auto first = test::run_process(args + " faults.kind=kill faults.step=5 2>&1");
  ASSERT_NE(first.status, 0) << "the fault did not fire:\n" << first.output;
  ASSERT_NE(first.output.find("fault injection"), std::string::npos) << first.output;
  auto second = test::run_process(args + " faults.kind=kill faults.step=5 faults.attempt=9 2>&1");
  ASSERT_EQ(second.status, 0) << second.output;
  ASSERT_NE(second.output.find("resum"), std::string::npos) << "no resume:\n" << second.output;

  auto r = test::run_process(std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR + "/tests/reference/tensorboard_reader.py " +
                             out + "/tb 2>&1");
  if (r.status == 3) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json tb = nlohmann::json::parse(r.output);
  std::map<int64_t, double> jsonl;  // step -> loss, as metrics.jsonl has it
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    jsonl[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  ASSERT_EQ(jsonl.size(), 8u);
  std::map<int64_t, int> seen;
  for (const auto& p : tb["scalars"]["train/loss"]) {
    const int64_t step = p[0].get<int64_t>();
    ++seen[step];
    ASSERT_TRUE(jsonl.count(step)) << step;
    EXPECT_NEAR(p[1].get<double>(), jsonl[step], 1e-6 * std::abs(jsonl[step]) + 1e-7) << "step " << step;
  }
  for (int64_t s = 1; s <= 8; ++s) EXPECT_EQ(seen[s], 1) << "step " << s << " written " << seen[s] << " times";
  EXPECT_TRUE(tb["scalars"].contains("perf/tokens_per_s"));
  EXPECT_TRUE(tb["scalars"].contains("checkpoint/write_s"));
  EXPECT_TRUE(tb["histograms"].contains("train/sample_loss"));
  // One bucket (2x4x4 latents): its loss is the step's, logged every step here.
  ASSERT_TRUE(tb["scalars"].contains("train/loss_by_bucket/2x4x4")) << tb["scalars"].dump().substr(0, 300);
  for (const auto& p : tb["scalars"]["train/loss_by_bucket/2x4x4"])
    EXPECT_NEAR(p[1].get<double>(), jsonl[p[0].get<int64_t>()], 1e-5 * jsonl[p[0].get<int64_t>()]) << p.dump();
  ASSERT_TRUE(tb["scalars"].contains("memory/host_heap_gib"));
  EXPECT_GT(tb["scalars"]["memory/host_heap_gib"][0][1].get<double>(), 0);
  ASSERT_TRUE(tb["texts"].contains("config"));
  EXPECT_NE(tb["texts"]["config"][0][1].get<std::string>().find("[model]"), std::string::npos);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(out + "/tb")) files += e.path().filename().string().rfind("events.out.tfevents", 0) == 0;
  EXPECT_EQ(files, 2);  // one per attempt
}

}  // namespace
}  // namespace vidit
