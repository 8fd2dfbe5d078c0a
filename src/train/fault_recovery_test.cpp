// Recovery shown by real jobs: `vidit train` under mpirun (2 ranks, FSDP, so checkpoints are in
// parts), a fault injected through [faults], then the same command with --resume. Each case
// checks that the job recovers by itself from the newest checkpoint that verifies, that the work
// lost is at most one checkpoint interval, and that the final weights equal, bit for bit, those
// of an uninterrupted run of the same mesh (the CPU is deterministic).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"
#include "checkpoint/checkpoint.h"

namespace vidit {
namespace {

// 8 steps of the tiny model on 2 ranks (FSDP), a checkpoint every 2 steps.
std::string train_command(const std::string& out_dir, const std::string& extra = "") {
  return std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out_dir +
         " train.steps=8 checkpoint.every=2 checkpoint.keep=3 parallel.shard=2" + (extra.empty() ? "" : " " + extra);
}

void expect_same_weights(const std::string& a, const std::string& b) {
  const CheckpointState x = load_checkpoint(*latest_checkpoint(a)), y = load_checkpoint(*latest_checkpoint(b));
  EXPECT_EQ(x.step, y.step);
  ASSERT_EQ(x.model.size(), y.model.size());
  for (const auto& [name, t] : y.model) EXPECT_TRUE(at::equal(x.model.at(name), t)) << name;
  for (const auto& [name, t] : y.ema) EXPECT_TRUE(at::equal(x.ema.at(name), t)) << name;
}

struct FaultCase {
  const char* name;
  const char* fault;        // --set items for the faulty run
  const char* resumed_from; // the checkpoint the resume must start from
  const char* says;         // what the resume must report
  const char* fault_says;   // what the faulty run must report
  int fault_status;         // its exit status (-1: any non-zero)
};

class FaultRecovery : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultRecovery, ResumesFromTheNewestGoodCheckpointAndEqualsTheUninterruptedRun) {
  VIDIT_REQUIRE_MPI();
  const FaultCase& c = GetParam();
  test::ScratchDir dir(std::string("fault_") + c.name);
  const std::string straight = dir.path() + "/straight", faulty = dir.path() + "/faulty";
  auto ok = test::mpirun(2, train_command(straight), 180);
  ASSERT_EQ(ok.status, 0) << ok.output;

  // The faulty run: checkpoint faults act on the save of step 6, after which it stops
  // (--max-steps 6); a rank that dies takes the job down (mpirun ends the others).
  auto broken = test::mpirun(2, train_command(faulty, c.fault) + " --max-steps 6", 180);
  if (c.fault_status < 0)
    EXPECT_NE(broken.status, 0) << broken.output;
  else
    EXPECT_EQ(broken.status, c.fault_status) << broken.output;
  EXPECT_NE(broken.output.find("fault injection:"), std::string::npos) << broken.output;
  EXPECT_NE(broken.output.find(c.fault_says), std::string::npos) << broken.output;

  // The same command again with --resume: no person decides where to start.
  auto resumed = test::mpirun(2, train_command(faulty) + " --resume", 180);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(std::string("resumed from step ") + c.resumed_from), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find(c.says), std::string::npos) << resumed.output;
  expect_same_weights(faulty, straight);
  // metrics.jsonl has every step once, across the failure and the restart.
  std::ifstream metrics(faulty + "/metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(metrics, line);) steps.push_back(nlohmann::json::parse(line).at("step"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, FaultRecovery,
    ::testing::Values(
        // A rank killed (SIGKILL) after step 5: the work since step 4 is lost, nothing else.
        FaultCase{"KilledRank", "faults.kind=kill faults.step=5 faults.rank=1", "4", "resumed from step 4",
                  "kills itself", -1},
        // A scheduler's SIGTERM to one rank (preemption): every rank stops after the same step,
        // the step is saved, the job exits with the restart status, and nothing is lost.
        FaultCase{"Sigterm", "faults.kind=sigterm faults.step=5 faults.rank=1", "5", "resumed from step 5",
                  "stopped at step 5; run the same command to continue", 75},
        // The newest checkpoint's bytes rot after it was committed: found by its checksum, set
        // aside, and step 4 is used.
        FaultCase{"CorruptNewest", "faults.kind=corrupt_checkpoint faults.step=6", "4", "does not match its checksum",
                  "flipped 4096 bytes", 0},
        // The newest checkpoint's model part is cut to half its size.
        FaultCase{"TruncatedNewest", "faults.kind=truncate_checkpoint faults.step=6", "4", "truncated or overwritten",
                  "truncated", 0}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return std::string(info.param.name); });

// The same command again continues where the run stopped; --fresh starts over and keeps what
// the earlier run wrote, moved aside.
TEST(Train, SameCommandContinuesAndFreshStartsOver) {
  test::ScratchDir dir("train_fresh");
  const std::string cmd = std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() + " checkpoint.every=2";
  auto first = test::run_process(cmd + " --max-steps 2");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("starting from step 0"), std::string::npos) << first.output;
  auto again = test::run_process(cmd);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("resumed from step 2"), std::string::npos) << again.output;
  auto fresh = test::run_process(cmd + " --fresh");
  ASSERT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("starting from step 0"), std::string::npos) << fresh.output;
  EXPECT_NE(fresh.output.find("--fresh: the earlier run's checkpoints and metrics are now in"), std::string::npos)
      << fresh.output;
  std::vector<std::filesystem::path> aside;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("previous-", 0) == 0) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(aside[0] / "checkpoints/step_00000004/meta.json"));
  EXPECT_TRUE(std::filesystem::exists(aside[0] / "metrics.jsonl"));
  // The new run's metrics start at step 1 again.
  std::ifstream metrics(dir / "metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  EXPECT_EQ(nlohmann::json::parse(line).at("step"), 1);
}

}  // namespace
}  // namespace vidit
