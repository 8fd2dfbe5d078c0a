// Training with heads and MLP units split over 2 or 4 ranks under mpirun, alone or with data
// parallel, FSDP, Ulysses or ring attention, gives the single-process losses and parameters
// (fp32, 1e-5 relative) for the weights `vidit plan` predicts; a checkpoint written under tensor
// parallel resumes at another mesh.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/plan.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::sets_from_env;
using test::tiny_config;

// Ten steps of the tiny model (4 heads, 3 blocks) with the mesh in VIDIT_TP_SETS against one
// process; the checkpoint holds whole tensors.
TEST(MpiWorker, TensorParallelTrainingMatchesOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  Config cfg = tiny_config(sets_from_env("VIDIT_TP_SETS", {"train.steps=10", "train.batch_size=4",
                                                          "train.warmup_steps=2", "model.heads=4", "model.layers=3",
                                                          "train.out_dir=" + dir + "/tp"}));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  const int T = mesh->degree("tensor");
  ASSERT_GT(T, 1);
  Trainer split(cfg, data, null_text, at::kCPU, mesh);
  std::vector<double> losses = split.fit(-1, /*console=*/false);
  // This rank's weights are its part, as vidit plan says (FSDP pads its shards a little).
  double mine = 0;
  if (auto* fsdp = split.parallel_model().find<FullyShardedDataParallel>())
    mine = fsdp->shard_bytes() / 2.0;  // weights and gradients
  else
    for (auto& p : split.model()->parameters()) mine += 4.0 * p.numel();
  const double planned = plan_step(cfg).weights;
  // The layouts parallelize() gave are the ones vidit plan and checkpoints assume.
  EXPECT_EQ(split.parallel_model().layouts(), planned_layouts(split.parallel_model().whole_shapes(), cfg.parallel));
  EXPECT_NEAR(mine, planned, 0.005 * planned);
  world->barrier();

  if (world->rank() == 0) {
    Config one = cfg;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir + "/single";
    Trainer single(one, data, null_text);
    test::expect_losses(losses, single.fit(-1, false));
    CheckpointState s = load_checkpoint(*latest_checkpoint(dir + "/tp"));
    test::expect_params(s.model, state_dict(*single.model()), cfg.train.lr);
    test::expect_params(s.ema, single.ema()->weights(), cfg.train.lr);
    std::printf("tensor parallel (%s): final loss %.9g\n", std::getenv("VIDIT_TP_SETS"), losses.back());
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

class TensorParallelTraining : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(TensorParallelTraining, MatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  ScratchDir dir("tp");
  test::run_mesh_worker(GetParam(), "MpiWorker.TensorParallelTrainingMatchesOneProcess", "VIDIT_TP_SETS",
                        "VIDIT_TEST_DIR=" + dir.path());
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, TensorParallelTraining,
    ::testing::Values(test::WorkerMesh{"Tensor2Accumulating", 2, "parallel.tensor=2 train.grad_accum=2"},
                      test::WorkerMesh{"Tensor4", 4, "parallel.tensor=4"},
                      test::WorkerMesh{"Replicate2xTensor2", 4, "parallel.replicate=2 parallel.tensor=2"},
                      test::WorkerMesh{"Shard2xTensor2", 4, "parallel.shard=2 parallel.tensor=2"},
                      test::WorkerMesh{"Ulysses2xTensor2", 4, "parallel.ulysses=2 parallel.tensor=2"},
                      test::WorkerMesh{"Ring2xTensor2", 4, "parallel.ring=2 parallel.tensor=2"},
                      test::WorkerMesh{"Shard2xTensor2RecomputingAll", 4,
                                       "parallel.shard=2 parallel.tensor=2 train.recompute_blocks=-1"}),
    test::mesh_test_name);

// A checkpoint of tensor parallel x data parallel resumes as FSDP x tensor parallel, and one of
// FSDP x tensor parallel as plain FSDP (the worker is fsdp_training_test.cpp's).
TEST(Mpi, CheckpointUnderTensorParallelResumesAtAnotherMesh) {
  VIDIT_REQUIRE_MPI();
  for (const char* sets : {"VIDIT_FIRST_SETS='parallel.replicate=2 parallel.tensor=2' "
                           "VIDIT_RESUME_SETS='parallel.shard=2 parallel.tensor=2'",
                           "VIDIT_FIRST_SETS='parallel.shard=2 parallel.tensor=2' VIDIT_RESUME_SETS=parallel.shard=4"}) {
    ScratchDir dir("tp_resume");
    test::expect_workers_passed(
        test::mpirun_worker(4, "MpiWorker.FsdpCheckpointResumesAtAnotherMesh",
                            "VIDIT_TEST_DIR=" + dir.path() + " " + sets),
        4);
  }
}

}  // namespace
}  // namespace vidit
