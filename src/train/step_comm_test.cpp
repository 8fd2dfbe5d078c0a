// Under mpirun, the bytes a real training step sends, counted by CountingComm collective by
// collective, equal those of the step plan (parallel/plan.h), for each mesh listed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "parallel/comm.h"
#include "parallel/counting_comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/plan.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

// One measured step of the tiny model with the mesh in VIDIT_PLAN_SETS: bytes per collective
// as planned (within 0.5%: the plan leaves out the padding of shards).
TEST(MpiWorker, StepSendsWhatThePlanSays) {
  VIDIT_MPI_WORKER_ONLY();
  auto counting = std::make_shared<CountingComm>(make_world_comm(detect_launch_env()));
  ScratchDir dir("plan");
  Config cfg = tiny_config(test::sets_from_env(
      "VIDIT_PLAN_SETS", {"train.batch_size=4", "model.layers=3", "train.out_dir=" + dir.path()}));
  Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 32, 11), at::zeros({cfg.model.text_len, cfg.model.text_dim}),
            at::kCPU, std::make_shared<Mesh>(cfg, counting));
  t.step();
  counting->reset();
  t.step();
  const StepPlan plan = plan_step(cfg);
  for (const auto& [name, bytes] : plan.by_collective) {
    const double got = counting->counts().count(name) ? counting->counts().at(name) : 0;
    EXPECT_NEAR(got, bytes, 0.005 * bytes) << name << " (" << std::getenv("VIDIT_PLAN_SETS") << ")";
  }
  for (const auto& [name, bytes] : counting->counts())
    EXPECT_TRUE(plan.by_collective.count(name)) << name << ": " << bytes << " bytes sent but not planned";
  if (counting->rank() == 0)
    for (const auto& [name, bytes] : plan.by_collective)
      std::printf("plan check [%s] %s: measured %.0f B, planned %.0f B\n", std::getenv("VIDIT_PLAN_SETS"),
                  name.c_str(), counting->counts().count(name) ? counting->counts().at(name) : 0.0, bytes);
  counting->barrier();
  if (HasFailure()) abort_world(1);
}


class StepComm : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(StepComm, MatchesThePlan) {
  VIDIT_REQUIRE_MPI();
  const test::WorkerMesh& m = GetParam();
  test::run_mesh_worker(m, "MpiWorker.StepSendsWhatThePlanSays", "VIDIT_PLAN_SETS");
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, StepComm,
    ::testing::Values(test::WorkerMesh{"DataParallel4", 4, "parallel.replicate=4 train.grad_accum=2"},
                      test::WorkerMesh{"Fsdp4", 4, "parallel.shard=4 train.grad_accum=2"},
                      test::WorkerMesh{"Hsdp2x2Bf16Reduce", 4, "parallel.replicate=2 parallel.shard=2 parallel.reduce_dtype=bf16"},
                      // Weights gathered in bf16, the FP8 ones in e4m3 with their row scales agreed.
                      test::WorkerMesh{"Fsdp4Fp8RowwiseGathers", 4,
                                       "parallel.shard=4 train.grad_accum=2 train.precision=\"fp8_rowwise\" "
                                       "parallel.gather_dtype=\"bf16\""},
                      test::WorkerMesh{"Ulysses2xRing2", 4, "parallel.ulysses=2 parallel.ring=2"},
                      test::WorkerMesh{"Fsdp2xUlysses2", 4, "parallel.shard=2 parallel.ulysses=2 parallel.reshard_after_forward=false"},
                      test::WorkerMesh{"Ring4", 4, "parallel.ring=4"},
                      test::WorkerMesh{"Tensor2xReplicate2", 4, "parallel.replicate=2 parallel.tensor=2 train.grad_accum=2"},
                      test::WorkerMesh{"Shard2xTensor2", 4, "parallel.shard=2 parallel.tensor=2"},
                      test::WorkerMesh{"Tensor2xUlysses2", 4, "parallel.tensor=2 parallel.ulysses=2 model.heads=4"},
                      test::WorkerMesh{"Tensor2xRing2", 4, "parallel.tensor=2 parallel.ring=2"},
                      test::WorkerMesh{"Tensor2xRing2Recomputing2", 4, "parallel.tensor=2 parallel.ring=2 train.recompute_blocks=2"},
                      test::WorkerMesh{"Shard2xUlysses2RecomputingAll", 4, "parallel.shard=2 parallel.ulysses=2 train.recompute_blocks=-1"},
                      // The selective policy reruns the tensor-parallel sums but not attention's all-to-alls.
                      test::WorkerMesh{"Tensor2xUlysses2RecomputingSelectively", 4,
                                       "parallel.tensor=2 parallel.ulysses=2 model.heads=4 train.recompute_blocks=-1 "
                                       "train.recompute_policy=selective"}),
    test::mesh_test_name);

}  // namespace
}  // namespace vidit
