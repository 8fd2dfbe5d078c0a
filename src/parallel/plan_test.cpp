// The step plan: memory per rank falls as 1/shard; only valid meshes are listed; and under mpirun
// the bytes a real step sends, counted by CountingComm, equal the plan's, collective by collective.
#include "parallel/plan.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "parallel/counting_comm.h"
#include "../../tests/mpi_test_util.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

Config wan14b(const std::vector<std::string>& sets = {}) {
  return load_config(std::string(VIDIT_SOURCE_DIR) + "/configs/wan2.1-14b.toml", sets);
}

TEST(Plan, ShardingDividesTheTrainingState) {
  const StepPlan one = plan_step(wan14b({"parallel.replicate=8"}));
  const StepPlan eight = plan_step(wan14b({"parallel.shard=8"}));
  EXPECT_NEAR(one.weights, 4.0 * one.params, 1);
  EXPECT_NEAR(eight.weights * 8, one.weights, 8);
  EXPECT_NEAR(eight.optimizer * 8, one.optimizer, 8);
  EXPECT_GT(eight.gathered, 0);
  EXPECT_EQ(one.gathered, 0);
  // Data parallel all-reduces the gradients once; FSDP gathers every block twice (forward and
  // backward) and reduce-scatters the gradients once.
  const double volume = 7.0 / 8 * 4 * one.params;
  EXPECT_NEAR(one.by_collective.at("all_reduce"), 2 * volume, 1e-3 * one.params);
  EXPECT_GT(eight.by_collective.at("all_gather"), 1.9 * volume);
  EXPECT_LT(eight.by_collective.at("all_gather"), 2.1 * volume);
  EXPECT_NEAR(eight.by_collective.at("reduce_scatter"), volume, 1e-3 * one.params);
  EXPECT_FALSE(one.by_collective.count("all_to_all"));
}

// train.memory_budget_gb: the least recomputation that fits, selective before whole, and an
// error naming the key when nothing does. Wan 1.3B at its real 32,760 tokens, bf16, one GPU.
TEST(Plan, MemoryBudgetChoosesTheLeastRecomputationThatFits) {
  auto at_budget = [](double gb) {
    return load_config(std::string(VIDIT_SOURCE_DIR) + "/configs/wan2.1-1.3b.toml",
                       {"train.memory_budget_gb=" + std::to_string(gb)});
  };
  const Config c = at_budget(1000);
  const int64_t layers = c.model.layers;
  const double gib = double(1ll << 30);
  const double keep = plan_step(c, {0, 0}).memory() / gib, selective = plan_step(c, {0, layers}).memory() / gib,
               whole = plan_step(c, {layers, 0}).memory() / gib;
  ASSERT_GT(keep, selective);
  ASSERT_GT(selective, whole);
  EXPECT_EQ(recompute_counts(c).whole + recompute_counts(c).selective, 0) << "everything fits: nothing recomputed";
  for (double gb : {(keep + selective) / 2, selective + 0.01, (selective + whole) / 2, whole + 0.01}) {
    const Config b = at_budget(gb);
    gb = b.train.memory_budget_gb;  // as the config holds it
    const RecomputeCounts rc = recompute_counts(b);
    const StepPlan plan = plan_step(b);
    EXPECT_EQ(plan.recompute.whole, rc.whole);
    EXPECT_EQ(plan.recompute.selective, rc.selective);
    EXPECT_LE(plan.memory() / gib, gb) << gb << " GiB: " << rc.whole << " whole, " << rc.selective << " selective";
    // One block less recomputed (or recomputed selectively instead of whole) would not fit.
    const RecomputeCounts less = rc.whole > 0 ? RecomputeCounts{rc.whole - 1, rc.selective + 1}
                                              : RecomputeCounts{0, rc.selective - 1};
    ASSERT_GE(less.selective, 0);
    EXPECT_GT(plan_step(b, less).memory() / gib, gb) << gb << " GiB";
    if (gb > selective) EXPECT_EQ(rc.whole, 0) << "selective comes first";
  }
  try {
    recompute_counts(at_budget(whole / 2));
    ADD_FAILURE() << "a budget below every block recomputed must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.memory_budget_gb"), std::string::npos) << e.what();
  }
}

TEST(Plan, ListsOnlyMeshesThatSplitEvenlyAndMarksWhatFits) {
  // 14B at 1280 tokens per sample, 16 samples per step.
  Config c = wan14b({"data.latent_frames=5", "data.latent_height=32", "data.latent_width=32", "train.batch_size=16"});
  auto all = plan_meshes(c, 16, 0);
  ASSERT_FALSE(all.empty());
  for (const auto& m : all) {
    EXPECT_EQ(m.mesh.replicate * m.mesh.shard * m.mesh.ulysses * m.mesh.ring * m.mesh.tensor, 16);
    EXPECT_EQ(c.model.heads % (m.mesh.ulysses * m.mesh.tensor), 0);
  }
  // 80 GB: the unsharded 14B state (20 bytes per parameter with the EMA, 286 GB) cannot fit;
  // 16 shards can.
  auto fitting = plan_meshes(c, 16, 80e9);
  bool replicated_fits = true, sharded_fits = false;
  for (const auto& m : fitting) {
    if (m.mesh.shard == 1 && m.mesh.tensor == 1) replicated_fits &= m.fits;
    if (m.mesh.shard == 16 && m.fits) sharded_fits = true;
  }
  EXPECT_FALSE(replicated_fits);
  EXPECT_TRUE(sharded_fits);
  EXPECT_TRUE(fitting.front().fits);
  EXPECT_NE(format_meshes(c, fitting, 80e9).find("replicate 1 x shard 16"), std::string::npos);
}

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
