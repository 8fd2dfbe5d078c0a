// MFU in a training run: each step logged to metrics.jsonl carries its achieved TFLOP/s and, with
// train.peak_tflops given, the MFU against that peak; without a peak (the CPU has no entry in
// core/peak_flops.h's table) no MFU is claimed.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "train/trainer.h"

namespace vidit {
namespace {

TEST(PeakFlops, TrainingLogsMfuAgainstTheGivenPeak) {
  test::ScratchDir dir("mfu");
  Config cfg = test::tiny_config({"train.steps=2", "train.log_every=1", "train.peak_tflops=0.5",
                                  "train.out_dir=" + dir.path()});
  Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 8, 1), at::zeros({cfg.model.text_len, cfg.model.text_dim}));
  t.fit(-1, /*console=*/false);
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("mfu")) << line;
    EXPECT_GT(double(j["tflops"]), 0);
    EXPECT_NEAR(double(j["mfu"]), double(j["tflops"]) / 0.5, 1e-12) << line;
    ++n;
  }
  EXPECT_EQ(n, 2);
  // Without a peak (the CPU has no table entry) nothing is claimed.
  test::ScratchDir none("mfu_none");
  Config c2 = test::tiny_config({"train.steps=1", "train.out_dir=" + none.path()});
  Trainer t2(c2, std::make_shared<SyntheticDataset>(c2, 8, 1), at::zeros({c2.model.text_len, c2.model.text_dim}));
  t2.fit(-1, false);
  std::ifstream in2(none / "metrics.jsonl");
  ASSERT_TRUE(std::getline(in2, line));
  EXPECT_FALSE(nlohmann::json::parse(line).contains("mfu")) << line;
}

}  // namespace
}  // namespace vidit
