// Silent data corruption shown by real jobs: one bit of one replica's weights flips (the
// product's fault injection, after step 5) under mpirun; the check before the next save finds
// it, names the rank and its host, records it in events.jsonl and ends the job with status 87
// before anything diverged is saved; the same command then resumes from the last checkpoint and
// ends bitwise equal to an uninterrupted run.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../../tests/test_util.h"
#include "diagnose/events.h"
#include "diagnose/replica_check.h"
#include "../../tests/mpi_test_util.h"
#include "checkpoint/checkpoint.h"

namespace vidit {
namespace {

std::string train_command(const std::string& out_dir, const std::string& extra) {
  return std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out_dir + " train.steps=8 checkpoint.every=2 " + extra;
}

struct FlipCase {
  const char* name;
  const char* mesh;  // --set items
  int rank;          // whose bit flips
  const char* says;  // how the report must begin
  const char* also;  // and what else it must say
};

class ReplicaCheck : public ::testing::TestWithParam<FlipCase> {};

TEST_P(ReplicaCheck, FlippedBitIsFoundNamedAndNeverSaved) {
  VIDIT_REQUIRE_MPI();
  const FlipCase& c = GetParam();
  test::ScratchDir dir(std::string("replicas_") + c.name);
  const std::string straight = dir.path() + "/straight", faulty = dir.path() + "/faulty";
  auto ok = test::mpirun(4, train_command(straight, c.mesh), 180);
  ASSERT_EQ(ok.status, 0) << ok.output;

  const std::string flip = std::string(" faults.kind=bitflip faults.step=5 faults.rank=") + std::to_string(c.rank);
  auto broken = test::mpirun(4, train_command(faulty, std::string(c.mesh) + flip), 180);
  EXPECT_EQ(broken.status, kCorruptionStatus) << broken.output;
  EXPECT_NE(broken.output.find("silent data corruption after step 6: " + std::string(c.says)), std::string::npos)
      << broken.output;
  EXPECT_NE(broken.output.find(c.also), std::string::npos) << broken.output;
  // Found before the save of step 6: the newest checkpoint is step 4's.
  ASSERT_TRUE(latest_checkpoint(faulty));
  EXPECT_EQ(load_checkpoint(*latest_checkpoint(faulty)).step, 4);
  bool recorded = false;
  for (const auto& e : read_events(faulty))
    if (e.at("event") == "replicas_diverged") {
      recorded = true;
      EXPECT_EQ(e.at("step"), 6);
      EXPECT_NE(std::find(e.at("suspects").begin(), e.at("suspects").end(), c.rank), e.at("suspects").end()) << e.dump();
    }
  EXPECT_TRUE(recorded);

  // The same command again: resumes from step 4 and ends as the uninterrupted run did.
  auto resumed = test::mpirun(4, train_command(faulty, c.mesh), 180);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from step 4"), std::string::npos) << resumed.output;
  const CheckpointState x = load_checkpoint(*latest_checkpoint(faulty)), y = load_checkpoint(*latest_checkpoint(straight));
  EXPECT_EQ(x.step, 8);
  for (const auto& [name, t] : y.model) EXPECT_TRUE(at::equal(x.model.at(name), t)) << name;
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, ReplicaCheck,
    ::testing::Values(
        // Four replicas: three agree, so the odd one is named.
        FlipCase{"FourReplicas", "parallel.replicate=4", 2, "rank 2 (",
                 ") holds weights that differ from the other 3 replicas of the same shard"},
        // HSDP 2 x 2: ranks 1 and 3 hold shard 1; with two there is no majority, both are named.
        FlipCase{"TwoReplicasOfAShard", "parallel.replicate=2 parallel.shard=2", 3, "rank 1 (",
                 ") and rank 3 ("}),
    [](const ::testing::TestParamInfo<FlipCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace vidit
