// Straggler scores on made-up times, then a real job: under mpirun one rank's compute is made
// slow by the product's fault injection, and the run names it with its host, scores it below
// the threshold, and records it in events.jsonl and metrics.jsonl.
#include <gtest/gtest.h>

#include <fstream>

#include "../../tests/test_util.h"
#include "diagnose/events.h"
#include "diagnose/stragglers.h"
#include "../../tests/mpi_test_util.h"
#include "resilience/run_lock.h"

namespace vidit {
namespace {

TEST(StragglerDetector, NamesARankThatStaysSlowAndItsRecovery) {
  StragglerDetector d(0.7, 3);
  // Four ranks at about 1 s; rank 2 at 3 s from the second step, back at 1 s from the sixth.
  std::vector<std::vector<double>> steps = {{1, 1.1, 1, 0.9}, {1, 1.1, 3, 0.9}, {1, 1, 3, 1},
                                            {1, 1, 3.2, 1},   {1, 1, 3, 1},     {1, 1, 1, 1}};
  std::vector<StragglerChange> all;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto c = d.observe(steps[i]);
    if (i < 3) {
      EXPECT_TRUE(c.empty()) << "step " << i << ": not yet 3 in a row";
    }
    for (auto& x : c) all.push_back(x);
  }
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].rank, 2);
  EXPECT_TRUE(all[0].straggling);
  EXPECT_EQ(all[0].steps, 3);
  EXPECT_NEAR(all[0].score.relative, 1.0 / 3.2, 1e-9);
  EXPECT_NEAR(all[0].score.individual, 1.0 / 3.2, 1e-9);  // its own best: 1 s, in the first step
  EXPECT_EQ(all[1].rank, 2);
  EXPECT_FALSE(all[1].straggling);
  EXPECT_FALSE(d.straggling(2));
  // A rank only a little slower, or slow once, is not one.
  StragglerDetector e(0.7, 3);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(e.observe({1, 1.3, i == 4 ? 5.0 : 1.0}).empty());
  // Nor the jitter of 10 ms steps: 3x as long, but only 20 ms more.
  StragglerDetector f(0.7, 3);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(f.observe({0.01, 0.03}).empty());
}

TEST(Stragglers, SlowRankIsNamedWithItsHost) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("straggler");
  // Rank 1's forward pass takes 0.15 s longer from step 2 on: several times the tiny step.
  auto run = test::mpirun(2, std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() +
                                 " train.steps=8 parallel.shard=2 faults.kind=slow faults.step=2 faults.rank=1 "
                                 "faults.seconds=0.15 train.straggler_exclude_steps=6",
                          180);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("straggler: rank 1 (" + host_name() + ") has computed"), std::string::npos) << run.output;
  int flagged = 0;
  for (const auto& e : read_events(dir.path()))
    if (e.at("event") == "straggler") {
      ++flagged;
      EXPECT_EQ(e.at("rank"), 1);
      EXPECT_EQ(e.at("host"), host_name());
      EXPECT_LT(double(e.at("score")), 0.7) << e.dump();
      EXPECT_EQ(e.at("step"), 4) << "steps 2, 3 and 4 below the threshold";
    }
  EXPECT_EQ(flagged, 1);
  // Every logged step after the first slow one names it, with its host and score.
  std::ifstream metrics(dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("step") < 2) continue;
    EXPECT_EQ(j.at("slowest_rank"), 1) << line;
    EXPECT_EQ(j.at("slowest_host"), host_name()) << line;
    EXPECT_LT(double(j.at("slowest_score")), 0.7) << line;
  }
  // A straggler for train.straggler_exclude_steps = 6 logged steps (steps 2 to 7): its host is
  // on the exclude list, once.
  std::ifstream list(dir / "exclude_hosts.txt");
  std::vector<std::string> hosts;
  for (std::string line; std::getline(list, line);) hosts.push_back(line);
  EXPECT_EQ(hosts, std::vector<std::string>{host_name()});
  int excluded = 0;
  for (const auto& e : read_events(dir.path()))
    if (e.at("event") == "excluded") {
      ++excluded;
      EXPECT_EQ(e.at("step"), 7) << e.dump();
    }
  EXPECT_EQ(excluded, 1);
}

}  // namespace
}  // namespace vidit
