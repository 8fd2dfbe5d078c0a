// `vidit doctor` on a real run that went through trouble: under mpirun, a rank computes slowly
// (a straggler) until the job stops at step 12; the same command resumes it, and a poisoned
// sample spikes step 20. The report tells all of it and names the host worth a look. And a
// profiled run: the report says where the profiled steps' time went.
#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"
#include "resilience/run_lock.h"

namespace vidit {
namespace {

TEST(Doctor, SaysWhereAProfiledRunsTimeWent) {
  test::ScratchDir dir("doctor_profile");
  const std::string run = std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() + " train.steps=4 train.profile_steps=2";
  const test::ProcessResult r = test::run_process(run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("profile of steps 2-3 (rank 0,"), std::string::npos) << r.output;
  const test::ProcessResult doctor = test::run_process(std::string(VIDIT_BINARY) + " doctor " + dir.path());
  ASSERT_EQ(doctor.status, 0) << doctor.output;
  const std::string& report = doctor.output;
  EXPECT_NE(report.find("profile of steps 2-3, rank 0 ("), std::string::npos) << report;
  EXPECT_NE(report.find("host matmul "), std::string::npos) << report;
  EXPECT_NE(report.find(", idle "), std::string::npos) << report;
}

TEST(Doctor, TellsTheStoryOfATroubledRun) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("doctor");
  const std::string run = std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() +
                          " train.steps=24 checkpoint.every=4 parallel.shard=2 train.spike_action=skip "
                          "train.spike_bins=4 train.spike_warmup=8 ";
  auto slow = test::mpirun(2, run + "faults.kind=slow faults.step=2 faults.rank=1 faults.seconds=0.15 --max-steps 12", 180);
  ASSERT_EQ(slow.status, 0) << slow.output;
  auto poisoned = test::mpirun(2, run + "faults.kind=poison_sample faults.step=20 faults.rank=0", 180);
  ASSERT_EQ(poisoned.status, 0) << poisoned.output;

  auto doctor = test::run_process(std::string(VIDIT_BINARY) + " doctor " + dir.path());
  ASSERT_EQ(doctor.status, 0) << doctor.output;
  const std::string& r = doctor.output;
  for (const std::string& says :
       {std::string("started at step 0 (attempt 0, 2 ranks on 1 host(s), openmpi)"), std::string("resumed at step 12"),
        "step 4: straggler rank 1 (" + host_name() + "), score 0.", std::string("step 20: spike in the loss"),
        std::string("on rank 0 (z "), std::string("step 20: update skipped (spike, 1 in a row)"),
        std::string("finished at step 24"), std::string("attempts: 2 (1 restart(s))"),
        std::string("steps: 24 logged"), std::string("saves: "), std::string("hosts worth a look"),
        "  " + host_name() + ": straggler x1"})
    EXPECT_NE(r.find(says), std::string::npos) << "missing '" << says << "' in:\n" << r;

  // A directory that holds no run is refused by name.
  test::ScratchDir empty("doctor_empty");
  auto none = test::run_process(std::string(VIDIT_BINARY) + " doctor " + empty.path());
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("holds no events.jsonl or metrics.jsonl"), std::string::npos) << none.output;
}

}  // namespace
}  // namespace vidit
