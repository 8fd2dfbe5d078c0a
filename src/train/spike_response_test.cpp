// What a spike leads to, in real two-rank jobs (mpirun) whose faults the product injects:
//  - a transient device error (glitch: one prediction x 100, once) is told from bad data by the
//    re-run: it does not reproduce, the rank is named, nothing is quarantined;
//  - a poisoned sample in the prepared cache (the demo's real videos through FFmpeg and
//    `vidit prepare`'s code; the entry written x 1000 with a valid checksum) is blamed by its
//    source file each epoch, quarantined after train.quarantine_after blames and skipped by the
//    loader from then on, and the run completes;
//  - with train.spike_action = "rollback" the run returns to its newest checkpoint with the
//    sample quarantined at once, replays without it, and goes on at the backed-off learning rate;
//    metrics.jsonl holds every step once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>

#include "../../tests/test_util.h"
#include "diagnose/events.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

std::vector<nlohmann::json> events_of(const std::string& dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& e : read_events(dir))
    if (e.at("event") == kind) out.push_back(e);
  return out;
}

std::map<int64_t, nlohmann::json> metrics_by_step(const std::string& dir, size_t* lines) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream f(dir + "/metrics.jsonl");
  *lines = 0;
  for (std::string line; std::getline(f, line); ++*lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j;
  }
  return out;
}

TEST(Spikes, ADeviceErrorIsToldFromTheDataByARerun) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("glitch");
  const std::string out = dir.path() + "/run";
  auto r = test::mpirun(2,
                        std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out +
                            " train.steps=24 parallel.shard=2 train.spike_action=skip train.spike_bins=4 "
                            "train.spike_warmup=8 faults.kind=glitch faults.step=20 faults.rank=1",
                        180);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto spikes = events_of(out, "spike");
  ASSERT_EQ(spikes.size(), 1u) << r.output;
  EXPECT_EQ(spikes[0].at("step"), 20);
  EXPECT_EQ(spikes[0].at("cause"), "device") << spikes[0].dump();
  ASSERT_EQ(spikes[0].at("not_reproduced_on").size(), 1u);
  EXPECT_EQ(spikes[0].at("not_reproduced_on")[0].get<std::string>().rfind("rank 1 (", 0), 0u) << spikes[0].dump();
  EXPECT_TRUE(spikes[0].at("quarantined").empty());
  EXPECT_FALSE(std::filesystem::exists(out + "/quarantine.json"));
  ASSERT_EQ(events_of(out, "skipped_update").size(), 1u);
  EXPECT_NE(r.output.find("did not reproduce when re-run"), std::string::npos) << r.output;
}

// The demo's videos (made and prepared by the product itself), a tiny model.
std::string demo_run(const std::string& out_dir, const std::string& extra) {
  return std::string(VIDIT_BINARY) +
         " train --set model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.freq_dim=16 demo.videos=16 "
         "train.threads=1 train.log_every=1 train.spike_bins=4 train.spike_warmup=8 "
         "faults.kind=poison_cache faults.sample=clip_0003.mp4 train.out_dir=" +
         out_dir + " " + extra;
}

// (The demo renders its videos on every rank into a folder of its own, so each rank's copy of
// clip_0003.mp4 is a sample with a key of its own, blamed and quarantined on its own; both copies
// may be met in one step. The keys
// hash the file's path, so the data order depends on the scratch directory: enough epochs that
// a copy is always met more than twice.)
TEST(Spikes, APoisonedCacheSampleIsBlamedByItsSourceQuarantinedAndSkipped) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("quarantine");
  const std::string out = dir.path() + "/run";
  const int64_t steps = 120;
  auto r = test::mpirun(2, demo_run(out, "parallel.shard=2 train.steps=" + std::to_string(steps) +
                                             " train.spike_action=skip train.quarantine_after=2"), 300);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto spikes = events_of(out, "spike");
  ASSERT_GE(spikes.size(), 2u) << r.output;
  std::map<std::string, int> blames;
  int64_t last_quarantine = 0;
  for (const auto& s : spikes) {
    EXPECT_EQ(s.at("cause"), "data") << s.dump();
    // Both ranks' copies may be met in the same step: one blame each.
    ASSERT_GE(s.at("blamed").size(), 1u) << s.dump();
    ASSERT_LE(s.at("blamed").size(), 2u) << s.dump();
    size_t second_blames = 0;
    for (const auto& blamed : s.at("blamed")) {
      const nlohmann::json& id = blamed.at("sample");
      EXPECT_EQ(std::filesystem::path(id.at("source").get<std::string>()).filename(), "clip_0003.mp4") << s.dump();
      const std::string key = id.at("key");
      // Quarantined at its second blame, and never met again.
      EXPECT_LT(blames[key], 2) << key << " was met after its quarantine";
      if (++blames[key] == 2) ++second_blames, last_quarantine = s.at("step");
    }
    EXPECT_EQ(s.at("quarantined").size(), second_blames) << s.dump();
  }
  std::ifstream qf(out + "/quarantine.json");
  ASSERT_TRUE(qf) << "no quarantine.json";
  const nlohmann::json q = nlohmann::json::parse(qf);
  int quarantined = 0;
  for (const auto& [key, n] : blames) {
    if (n < 2) continue;
    ++quarantined;
    EXPECT_EQ(q.at("samples").at(key).at("quarantined"), true) << q.dump(2);
    EXPECT_EQ(q.at("samples").at(key).at("blamed_at").size(), 2u);
    EXPECT_NE(r.output.find("[loader] skipping quarantined sample " + key), std::string::npos) << r.output;
  }
  EXPECT_GE(quarantined, 1);
  EXPECT_LT(last_quarantine, steps);
  size_t lines = 0;
  const auto metrics = metrics_by_step(out, &lines);
  EXPECT_EQ(int64_t(lines), steps);
  EXPECT_EQ(metrics.rbegin()->first, steps);
}

TEST(Spikes, RollbackReturnsToTheCheckpointAndReplaysWithoutTheSample) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("rollback");
  const std::string out = dir.path() + "/run";
  auto r = test::mpirun(2,
                        demo_run(out, "parallel.shard=2 train.steps=40 train.spike_action=rollback checkpoint.every=2 "
                                      "train.schedule=constant train.warmup_steps=0 train.rollback_lr_scale=0.5"),
                        300);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto spikes = events_of(out, "spike"), rollbacks = events_of(out, "rollback");
  ASSERT_GE(rollbacks.size(), 1u) << r.output;
  for (const auto& rb : rollbacks) {
    const int64_t at = rb.at("step"), to = rb.at("to");
    const auto spike = std::find_if(spikes.begin(), spikes.end(), [&](const nlohmann::json& s) { return s.at("step") == at; });
    ASSERT_NE(spike, spikes.end()) << "a rollback without a spike at step " << at;
    EXPECT_EQ(spike->at("cause"), "data");
    EXPECT_EQ(spike->at("quarantined").size(), 1u) << "a rollback quarantines at once";
    EXPECT_EQ(to, (at - 1) / 2 * 2) << "back to the newest checkpoint before the spike";
  }
  EXPECT_NE(r.output.find("[loader] skipping quarantined sample"), std::string::npos) << r.output;
  std::ifstream qf(out + "/quarantine.json");
  ASSERT_TRUE(qf);
  EXPECT_EQ(nlohmann::json::parse(qf).at("rollbacks").size(), rollbacks.size());
  // Every step once; the learning rate halved by each rollback.
  size_t lines = 0;
  const auto metrics = metrics_by_step(out, &lines);
  EXPECT_EQ(lines, 40u);
  EXPECT_EQ(metrics.rbegin()->first, 40);
  const double first = metrics.at(1).at("lr"), last = metrics.at(40).at("lr");
  EXPECT_DOUBLE_EQ(last, first * std::pow(0.5, double(rollbacks.size())));
}

}  // namespace
}  // namespace vidit
