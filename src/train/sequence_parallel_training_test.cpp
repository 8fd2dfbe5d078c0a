// Training with the tokens split over 2 or 4 ranks under mpirun (Ulysses, ring attention or
// both, alone or with data parallel, with blocks recomputed, with Wan 2.2 TI2V's timestep per
// token) gives the single-process losses and
// parameters (fp32, 1e-5 relative).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

using test::rel_err;

// Ten steps of the tiny model with the mesh in VIDIT_SP_SETS: the same losses and parameters as
// one process training the same global batches.
TEST(MpiWorker, SequenceParallelTrainingMatchesOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  ScratchDir dir("sp");
  Config cfg = tiny_config(test::sets_from_env("VIDIT_SP_SETS", {"train.steps=10", "train.batch_size=4",
                                                                 "train.warmup_steps=2", "train.out_dir=" + dir.path()}));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  ASSERT_GT(mesh->degree("sp"), 1);
  Trainer split(cfg, data, null_text, at::kCPU, mesh);
  std::vector<double> losses = split.fit(-1, /*console=*/false);

  for (auto& item : split.model()->named_parameters()) {
    at::Tensor mine = item.value().detach().clone(), lead = mine.clone();
    world->broadcast(lead, 0)->wait();
    EXPECT_LE(rel_err(mine, lead), 1e-7) << item.key() << " differs from rank 0's on rank " << world->rank();
  }
  if (world->rank() == 0) {
    Config one = cfg;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir / "single";
    Trainer single(one, data, null_text);
    std::vector<double> want = single.fit(-1, false);
    test::expect_losses(losses, want);
    test::expect_params(state_dict(*split.model()), state_dict(*single.model()), cfg.train.lr);
    std::printf("sequence parallel (%s): final loss %.9g (one process %.9g)\n", std::getenv("VIDIT_SP_SETS"),
                losses.back(), want.back());
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// The meshes: ranks and --set items.

class SequenceParallelTraining : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(SequenceParallelTraining, MatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  const test::WorkerMesh& m = GetParam();
  test::run_mesh_worker(m, "MpiWorker.SequenceParallelTrainingMatchesOneProcess", "VIDIT_SP_SETS");
}

// Two micro-batches with the ring: the gradient shares are summed once, after the last.
INSTANTIATE_TEST_SUITE_P(Mpi, SequenceParallelTraining,
                         ::testing::Values(test::WorkerMesh{"Ulysses2", 2, "parallel.ulysses=2"},
                                           // Wan 2.2 TI2V's timestep per token, split with the tokens
                                           test::WorkerMesh{"Ulysses2xRing2FirstFrameKept", 4,
                                                            "parallel.ulysses=2 parallel.ring=2 model.condition=\"first_frame\""},
                                           test::WorkerMesh{"Ring2Accumulating", 2, "parallel.ring=2 train.grad_accum=2"},
                                           test::WorkerMesh{"Ulysses2xRing2", 4, "parallel.ulysses=2 parallel.ring=2"},
                                           test::WorkerMesh{"Replicate2xUlysses2", 4, "parallel.replicate=2 parallel.ulysses=2"},
                                           test::WorkerMesh{"Replicate2xRing2", 4, "parallel.replicate=2 parallel.ring=2"},
                                           test::WorkerMesh{"Ulysses2xRing2Recomputing1", 4,
                                                            "parallel.ulysses=2 parallel.ring=2 train.recompute_blocks=1"},
                                           test::WorkerMesh{"Ulysses2xRing2RecomputingSelectively", 4,
                                                            "parallel.ulysses=2 parallel.ring=2 train.recompute_blocks=-1 "
                                                            "train.recompute_policy=selective"}),
                         test::mesh_test_name);

}  // namespace
}  // namespace vidit
