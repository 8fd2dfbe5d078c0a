// A hang in a real job: under mpirun rank 1 stops making progress after step 5 (the product's
// fault injection); the others block in their next collective. With the step-based limit
// (train.stall_steps x the median step, at least train.stall_min_s) the job ends within
// seconds, not train.stall_timeout_s, and the report names the rank that did not arrive, from
// the heartbeats every rank's watchdog writes; rank 0 records it in events.jsonl.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"
#include "resilience/run_lock.h"
#include "resilience/watchdog.h"

namespace vidit {
namespace {

TEST(Watchdog, HangEndsSoonAndNamesTheRankThatDidNotArrive) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("watchdog_hang");
  const auto t0 = std::chrono::steady_clock::now();
  auto run = test::mpirun(2, std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() +
                                 " train.steps=12 parallel.shard=2 train.stall_timeout_s=600 train.stall_steps=20 "
                                 "train.stall_min_s=3 faults.kind=hang faults.step=5 faults.rank=1",
                          120);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_NE(run.status, 124) << "the hang was not ended by the watchdog: " << run.output;
  EXPECT_LT(took, 60) << "train.stall_min_s = 3 s, not train.stall_timeout_s = 600 s";
  EXPECT_NE(run.output.find("made no progress for"), std::string::npos) << run.output;
  // The limit is 20 median steps of this tiny model, or train.stall_min_s = 3 s if that is more.
  const size_t at = run.output.find("(limit ");
  ASSERT_NE(at, std::string::npos) << run.output;
  EXPECT_LE(std::stod(run.output.substr(at + 7)), 20) << run.output;
  EXPECT_NE(run.output.find("ranks that did not arrive: rank 1 (" + host_name() + ", pid "), std::string::npos)
      << run.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "heartbeats/rank_00000.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "heartbeats/rank_00001.json"));
  // Each rank's main thread wrote where it was: the hung one in the fault's sleep, called from
  // the training loop.
  std::ifstream stack(dir / "heartbeats/rank_00001.stack");
  const std::string frames((std::istreambuf_iterator<char>(stack)), std::istreambuf_iterator<char>());
  EXPECT_NE(frames.find("vidit::FaultInjector::after_step"), std::string::npos) << frames;
  EXPECT_NE(frames.find("vidit::Trainer::fit"), std::string::npos) << frames;
  EXPECT_NE(run.output.find("rank 1: its main thread's stack"), std::string::npos) << run.output;
  // Rank 0's watchdog thread wrote the report into the run's events (train/metric_sinks.h).
  std::ifstream events(dir / "events.jsonl");
  bool hang = false;
  for (std::string line; std::getline(events, line);) {
    const nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == "hang")
      hang = e.value("report", "").find("rank 1") != std::string::npos;
  }
  EXPECT_TRUE(hang) << "no hang event naming rank 1 in " << (dir / "events.jsonl");
}

// A rank that has waited kBlockedBeatS in a collective writes a heartbeat at once (not at the
// next one-second beat), once per wait: when a rank dies and the launcher kills the rest a
// moment later, the survivors' heartbeats show they waited for it (diagnose/crashes.h).
TEST(Watchdog, ALongWaitInACollectiveGetsAHeartbeatAtOnce) {
  test::ScratchDir dir("watchdog_blocked");
  std::atomic<double> blocked{0};
  std::atomic<int64_t> issued{7};
  Watchdog wd(600, 0);
  wd.report_to(dir.path(), 1, [&] { return issued.load(); }, [&] { return blocked.load(); });
  auto read = [&] {
    std::ifstream beat(dir / "rank_00000.json");
    return nlohmann::json::parse(beat, nullptr, false);
  };
  const int64_t first = read().value("time_ms", int64_t(0));
  ASSERT_GT(first, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  issued = 8, blocked = 0.25;  // entered collective 8 and has waited 0.25 s
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const nlohmann::json j = read();
  EXPECT_GE(j.value("blocked_s", 0.0), kBlockedBeatS) << j.dump();
  EXPECT_EQ(j.value("collectives", int64_t(0)), 8) << j.dump();
  const int64_t second = j.value("time_ms", int64_t(0));
  EXPECT_GE(second - first, 150) << "the beat came with the wait";
  EXPECT_LT(second - first, 800) << "not with the one-second heartbeat";
}

}  // namespace
}  // namespace vidit
