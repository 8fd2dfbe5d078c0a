// The c10d engine (gloo) under a real torchrun launch: every collective on 2 and 4 processes;
// training with FSDP x tensor parallel and with Ulysses x ring equals one process; a rank that
// exits mid-step ends the job within seconds; `vidit train` runs under torchrun --no-python.
// (The workers are those the MPI tests run; only the launcher and the engine differ.)
#include "dist/comm_c10d.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "dist/mpi_test_util.h"

namespace vidit {
namespace {

using test::ScratchDir;

#define VIDIT_REQUIRE_TORCHRUN()                                              \
  do {                                                                        \
    std::string why_;                                                         \
    if (::vidit::test::torchrun_launcher(&why_).empty()) GTEST_SKIP() << why_; \
  } while (0)

TEST(Torchrun, GlooCollectivesOn2And4Processes) {
  VIDIT_REQUIRE_TORCHRUN();
  for (int np : {2, 4})
    test::expect_workers_passed(test::torchrun_worker(np, "MpiWorker.Collectives", "VIDIT_WANT_ENGINE=gloo"), np);
}

TEST(Torchrun, FsdpTimesTensorParallelMatchesOneProcess) {
  VIDIT_REQUIRE_TORCHRUN();
  ScratchDir dir("torchrun_tp");
  test::expect_workers_passed(
      test::torchrun_worker(4, "MpiWorker.TensorParallelTrainingMatchesOneProcess",
                            "VIDIT_TEST_DIR=" + dir.path() + " VIDIT_TP_SETS='parallel.shard=2 parallel.tensor=2'"),
      4);
}

TEST(Torchrun, UlyssesTimesRingMatchesOneProcess) {
  VIDIT_REQUIRE_TORCHRUN();
  test::expect_workers_passed(test::torchrun_worker(4, "MpiWorker.SequenceParallelTrainingMatchesOneProcess",
                                                    "VIDIT_SP_SETS='parallel.ulysses=2 parallel.ring=2'"),
                              4);
}

// Rank 1 exits at its 5th all-reduce (data_parallel_test.cpp's worker); rank 0, waiting in a
// collective, gets an error from gloo and torchrun ends the job: no hang.
TEST(Torchrun, RankThatExitsMidStepEndsTheJob) {
  VIDIT_REQUIRE_TORCHRUN();
  auto r = test::torchrun_worker(2, "MpiWorker.RankDiesMidStep", "", /*limit_s=*/120);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job hung until timeout killed it:\n" << r.output;
  EXPECT_LT(r.seconds, 90.0) << r.output;
  EXPECT_NE(r.output.find("injected fault: rank 1 exits in the middle of a step"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("finished training although"), std::string::npos) << r.output;
}

// The README's torchrun command: data parallel over 2 gives the single-process final loss.
TEST(Torchrun, TrainCommandMatchesOneProcess) {
  VIDIT_REQUIRE_TORCHRUN();
  ScratchDir one("torchrun_one"), two("torchrun_two");
  const std::string& sets = test::kTinyTrainArgs;
  auto single = test::run_process(std::string(VIDIT_BINARY) + sets + one.path());
  ASSERT_EQ(single.status, 0) << single.output;
  auto multi = test::torchrun(2, std::string(VIDIT_BINARY) + sets + two.path() + " parallel.replicate=2");
  ASSERT_EQ(multi.status, 0) << multi.output;
  EXPECT_NE(multi.output.find("(torchrun, gloo)"), std::string::npos) << multi.output;
  auto final_loss = [](const std::string& out) {
    const size_t at = out.find("final loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 11));
  };
  const double a = final_loss(single.output), b = final_loss(multi.output);
  ASSERT_GT(a, 0) << single.output;
  EXPECT_LE(std::abs(a - b) / a, 1e-5) << single.output << "\n" << multi.output;
}

}  // namespace
}  // namespace vidit
