// The c10d engine (gloo) under a real torchrun launch: every collective on 2 and 4 processes;
// training with FSDP x tensor parallel and with Ulysses x ring equals one process; a rank that
// exits mid-step ends the job within seconds; `vidit train` runs under torchrun --no-python.
// On a GPU machine, NCCL's collectives on CUDA tensors.
// (The workers are those the MPI tests run; only the launcher and the engine differ.)
#include "parallel/comm_c10d.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"

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

// Rank 1 exits at its 5th all-reduce (data_parallel_training_test.cpp's worker); rank 0, waiting
// in a collective, gets an error from gloo and torchrun ends the job: no hang.
TEST(Torchrun, RankThatExitsMidStepEndsTheJob) {
  VIDIT_REQUIRE_TORCHRUN();
  auto r = test::torchrun_worker(2, "MpiWorker.RankDiesMidStep", "", /*limit_s=*/120);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job hung until timeout killed it:\n" << r.output;
  EXPECT_LT(r.seconds, 90.0) << r.output;
  EXPECT_NE(r.output.find("injected fault: rank 1 exits in the middle of a step"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("finished training although"), std::string::npos) << r.output;
}

// GPU machines: the NCCL engine on CUDA tensors, as a one-member group under torchrun (NCCL
// refuses two ranks on one GPU, and the test machine has one). Every collective, bf16 included;
// values are checked after copying back. Skipped in builds without NCCL or without a GPU.
TEST(MpiWorker, NcclCollectivesOnOneGpu) {
  VIDIT_MPI_WORKER_ONLY();
  auto c = make_world_comm(detect_launch_env(), at::kCUDA);
  ASSERT_EQ(c->backend(), "nccl");
  ASSERT_EQ(c->size(), 1);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    at::Tensor a = at::arange(6, cuda.dtype(dt));
    c->all_reduce(a, ReduceOp::Sum)->wait();
    EXPECT_TRUE(at::equal(a.cpu(), at::arange(6, at::TensorOptions().dtype(dt)))) << dt;
    at::Tensor g = at::empty({2, 3}, cuda.dtype(dt));
    c->all_gather(at::ones({2, 3}, cuda.dtype(dt)), g)->wait();
    EXPECT_TRUE(at::equal(g.cpu(), at::ones({2, 3}, at::TensorOptions().dtype(dt)))) << dt;
  }
  at::Tensor in = at::full({4}, 3.0f, cuda), out = at::empty({4}, cuda);
  c->reduce_scatter(in, out, ReduceOp::Avg)->wait();
  EXPECT_TRUE(at::equal(out.cpu(), at::full({4}, 3.0f)));
  at::Tensor x = at::arange(8, cuda.dtype(at::kFloat)), y = at::empty({8}, cuda);
  c->all_to_all(x, y)->wait();
  EXPECT_TRUE(at::equal(y.cpu(), at::arange(8, at::kFloat)));
  at::Tensor b = at::full({3}, 5.0f, cuda);
  c->broadcast(b, 0)->wait();
  EXPECT_TRUE(at::equal(b.cpu(), at::full({3}, 5.0f)));
  // CPU tensors (the step's control-plane scalars) are staged through the GPU (staging_comm.h).
  at::Tensor totals = at::tensor({1.5, 2.0, 3.0}, at::kDouble);
  c->all_reduce(totals, ReduceOp::Sum)->wait();
  EXPECT_TRUE(totals.is_cpu());
  EXPECT_TRUE(at::equal(totals, at::tensor({1.5, 2.0, 3.0}, at::kDouble)));
  at::Tensor state = at::arange(5, at::kInt), states = at::zeros({5}, at::kInt);
  c->all_gather(state, states)->wait();
  EXPECT_TRUE(at::equal(states, at::arange(5, at::kInt)));
  c->barrier();
}

TEST(Torchrun, NcclCollectivesOnOneGpu) {
  std::string why;
  if (test::torchrun_launcher(&why, "nccl").empty()) GTEST_SKIP() << why;
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  test::expect_workers_passed(test::torchrun_worker(1, "MpiWorker.NcclCollectivesOnOneGpu",
                                                    "VIDIT_COMM=nccl VIDIT_COMM_TIMEOUT_S=60", 120, "nccl"),
                              1);
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
