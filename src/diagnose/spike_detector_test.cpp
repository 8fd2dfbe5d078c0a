// Spike detection: σ-aware baselines on made-up losses, then a real job in which the product's
// fault injection poisons one sample (latents x 1000) on one rank: the step is flagged, the
// sample is blamed by its identity and rank in forensics/step_N.json, the update is skipped, and
// the run completes. The same run without the poison flags nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "../../tests/test_util.h"
#include "diagnose/events.h"
#include "diagnose/spike_detector.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

// A loss that depends on σ as flow matching's does (high at both ends), with a little noise.
double typical_loss(double sigma, std::mt19937& rng) {
  std::normal_distribution<double> noise(0, 0.02);
  return 0.3 + 2.0 * (sigma - 0.5) * (sigma - 0.5) * 4 + noise(rng);
}

TEST(SpikeDetector, HardSigmasAreNotSpikesButABadSampleIs) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> any(0, 1), hard(0.9, 1.0);
  SpikeDetector d({8, 6.0, 8, 0.98});
  // Warm every bin with ordinary batches of 8.
  for (int step = 0; step < 60; ++step) {
    std::vector<SampleLoss> b;
    for (int i = 0; i < 8; ++i) {
      const double s = any(rng);
      b.push_back({s, typical_loss(s, rng)});
    }
    EXPECT_FALSE(d.observe(b, 1.0 + 0.01 * any(rng)).spike) << "ordinary step " << step;
  }
  // A batch that drew only hard σs: its mean loss is far above the running mean of step
  // losses (what a plain detector compares with), yet each sample is ordinary for its σ.
  std::vector<SampleLoss> hard_batch;
  double mean = 0;
  for (int i = 0; i < 8; ++i) {
    const double s = hard(rng);
    hard_batch.push_back({s, typical_loss(s, rng)});
    mean += hard_batch.back().loss / 8;
  }
  EXPECT_GT(mean, 1.5) << "the batch's loss is about 3x the typical step loss (~0.97)";
  const SpikeVerdict ok = d.observe(hard_batch, 1.0);
  EXPECT_FALSE(ok.spike) << "loss z " << ok.loss_z;
  EXPECT_EQ(ok.judged, 8);
  // One sample of eight with 5x its usual loss: flagged, and it has by far the highest z.
  std::vector<SampleLoss> bad;
  for (int i = 0; i < 8; ++i) {
    const double s = any(rng);
    bad.push_back({s, typical_loss(s, rng) * (i == 3 ? 5 : 1)});
  }
  const SpikeVerdict v = d.observe(bad, 1.0);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.why, "loss");
  const auto top = std::max_element(v.sample_z.begin(), v.sample_z.end()) - v.sample_z.begin();
  EXPECT_EQ(top, 3);
  // A gradient norm 20x its usual: flagged as such.
  std::vector<SampleLoss> fine;
  for (int i = 0; i < 8; ++i) {
    const double s = any(rng);
    fine.push_back({s, typical_loss(s, rng)});
  }
  const SpikeVerdict g = d.observe(fine, 20.0);
  EXPECT_TRUE(g.spike);
  EXPECT_EQ(g.why, "gradient norm");
  // Before a bin is warm nothing is judged.
  SpikeDetector cold({8, 6.0, 8, 0.98});
  EXPECT_FALSE(cold.observe({{0.5, 1000.0}}, 1000.0).spike);
}

std::string spike_run(const std::string& out_dir, const std::string& extra) {
  return std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out_dir +
         " train.steps=24 parallel.shard=2 train.spike_action=skip train.spike_bins=4 train.spike_warmup=8 " + extra;
}

TEST(Spikes, PoisonedSampleIsBlamedAndItsUpdateSkipped) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("spike");
  const std::string clean = dir.path() + "/clean", poisoned = dir.path() + "/poisoned";
  auto a = test::mpirun(2, spike_run(clean, ""), 180);
  ASSERT_EQ(a.status, 0) << a.output;
  for (const auto& e : read_events(clean)) EXPECT_NE(e.at("event"), "spike") << "a false alarm: " << e.dump();

  auto b = test::mpirun(2, spike_run(poisoned, "faults.kind=poison_sample faults.step=20 faults.rank=1"), 180);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("spike at step 20: the loss"), std::string::npos) << b.output;
  std::vector<int64_t> spikes, skipped;
  for (const auto& e : read_events(poisoned)) {
    if (e.at("event") == "spike") spikes.push_back(e.at("step"));
    if (e.at("event") == "skipped_update") skipped.push_back(e.at("step"));
  }
  EXPECT_EQ(spikes, std::vector<int64_t>{20});
  EXPECT_EQ(skipped, std::vector<int64_t>{20});
  std::ifstream f(poisoned + "/forensics/step_00000020.json");
  ASSERT_TRUE(f) << "no forensics file";
  const nlohmann::json report = nlohmann::json::parse(f);
  ASSERT_EQ(report.at("blamed").size(), 1u) << report.dump(2);
  const nlohmann::json& blamed = report.at("blamed")[0];
  EXPECT_EQ(blamed.at("rank"), 1);
  EXPECT_TRUE(blamed.at("sample").contains("index")) << blamed.dump();
  EXPECT_GT(double(blamed.at("z")), 6.0);
  // The re-run reproduced it: the data's fault, not the device's.
  EXPECT_EQ(report.at("cause"), "data") << report.dump(2);
  EXPECT_EQ(blamed.at("reproduced"), true);
  // The gradients of the model's parts jumped against their own baselines.
  ASSERT_FALSE(report.at("parts").empty());
  EXPECT_EQ(report.at("parts")[0].at("jumped"), true) << report.at("parts").dump();
  // Every sample of the step is listed (batch 4), the blamed one first.
  EXPECT_EQ(report.at("samples").size(), 4u);
  EXPECT_EQ(report.at("samples")[0], blamed);
  // The run went on after the skipped step and completed its 24 steps.
  std::ifstream metrics(poisoned + "/metrics.jsonl");
  int64_t last = 0;
  for (std::string line; std::getline(metrics, line);) last = nlohmann::json::parse(line).at("step");
  EXPECT_EQ(last, 24);
}

}  // namespace
}  // namespace vidit
