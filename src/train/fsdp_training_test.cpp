// FSDP / HSDP in real processes under mpirun: training with sharded parameters, gradients and
// optimizer state gives the single-process losses and parameters (fp32); each member keeps 1/S
// of the state and none of the model's own weights between steps; a checkpoint written at one
// mesh resumes at another as the uninterrupted run; FP8 weights gathered in e4m3 train bitwise as
// gathered in fp32, for the bytes `vidit plan` predicts; weights gathered in bf16 halve the bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/plan.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

using test::expect_losses;
using test::expect_params;
using test::sets_from_env;

TensorMap whole_weights(const std::string& out_dir) {
  return load_checkpoint(*latest_checkpoint(out_dir)).model;
}

// Ten steps of the tiny model (4 blocks) with the mesh in VIDIT_FSDP_SETS.
TEST(MpiWorker, FsdpTrainingMatchesOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  Config cfg = tiny_config(sets_from_env("VIDIT_FSDP_SETS", {"train.steps=10", "train.batch_size=4",
                                                              "train.warmup_steps=2", "model.layers=4",
                                                              "train.out_dir=" + dir + "/fsdp"}));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  const int S = mesh->degree("shard");
  ASSERT_GT(S, 1);
  Trainer sharded(cfg, data, null_text, at::kCPU, mesh);
  std::vector<double> losses = sharded.fit(-1, /*console=*/false);

  // Between steps the model's own parameters hold no memory.
  for (auto& item : sharded.model()->named_parameters())
    EXPECT_EQ(item.value().storage().nbytes(), 0u) << item.key() << " still holds its weights";
  world->barrier();

  if (world->rank() == 0) {
    Config one = cfg;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir + "/single";
    Trainer single(one, data, null_text);
    expect_losses(losses, single.fit(-1, false));
    expect_params(whole_weights(dir + "/fsdp"), state_dict(*single.model()), cfg.train.lr);
    std::printf("fsdp (%s): %d shards, final loss %.9g\n", std::getenv("VIDIT_FSDP_SETS"), S, losses.back());
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// Memory: weights + gradients + AdamW moments + EMA per member, against one process's.
TEST(MpiWorker, FsdpKeepsOneShardOfTheState) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const int n = world->size();
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  Config cfg = tiny_config({"train.steps=1", "train.batch_size=4", "model.layers=4", "model.dim=64",
                            "model.ffn_dim=128", "parallel.shard=" + std::to_string(n),
                            "train.out_dir=" + dir + "/mem"});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 32, 11), at::zeros({cfg.model.text_len, cfg.model.text_dim}),
            at::kCPU, mesh);
  t.step();
  const auto& fsdp = *t.parallel_model().find<FullyShardedDataParallel>();
  int64_t whole_bytes = 0, shard_bytes = 0;
  for (const auto& [name, p] : t.parallel_model().whole_shapes()) whole_bytes += p.numel() * 4;
  for (const auto& [name, s] : fsdp.shards()) shard_bytes += s.numel() * 4;
  // Weights are padded to a multiple of n per parameter: at most n - 1 extra elements each.
  const int64_t pad = int64_t(fsdp.shards().size()) * (n - 1) * 4 / n + 4 * int64_t(fsdp.shards().size());
  EXPECT_LE(shard_bytes, whole_bytes / n + pad);
  EXPECT_GE(shard_bytes, whole_bytes / n);
  EXPECT_EQ(fsdp.shard_bytes(), 2 * shard_bytes);  // weights and gradients
  // Gathered at most: the root and two blocks (one in use, one prefetched), well under the whole.
  EXPECT_LT(fsdp.peak_gathered_bytes(), whole_bytes * 3 / 4);
  EXPECT_GT(fsdp.peak_gathered_bytes(), 0);
  // What `vidit plan` says for this mesh (parallel/plan.h): the same shard and the same peak.
  const StepPlan plan = plan_step(cfg);
  EXPECT_NEAR(plan.weights, double(shard_bytes), double(pad));
  EXPECT_NEAR(plan.gathered, double(fsdp.peak_gathered_bytes()), 0.01 * plan.gathered);
  if (world->rank() == 0)
    std::printf("fsdp memory, %d shards: whole model %lld B; per member %lld B of weights (%.3f of the whole), "
                "peak gathered %lld B\n", n, (long long)whole_bytes, (long long)shard_bytes,
                double(shard_bytes) / double(whole_bytes), (long long)fsdp.peak_gathered_bytes());
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// 5 steps at one mesh (checkpoint), then 5 more at another (VIDIT_RESUME_SETS) from that
// checkpoint: the losses are those of 10 uninterrupted single-process steps.
TEST(MpiWorker, FsdpCheckpointResumesAtAnotherMesh) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  std::vector<std::string> base = {"train.steps=10", "train.batch_size=4", "train.warmup_steps=2", "model.layers=3",
                                   "checkpoint.every=5", "train.out_dir=" + dir + "/resharded"};
  Config first = tiny_config(sets_from_env("VIDIT_FIRST_SETS", base));
  Config second = tiny_config(sets_from_env("VIDIT_RESUME_SETS", base));
  auto data = std::make_shared<SyntheticDataset>(first, 32, 11);
  auto null_text = at::zeros({first.model.text_len, first.model.text_dim});
  std::vector<double> a, b;
  {
    Trainer t(first, data, null_text, at::kCPU, std::make_shared<Mesh>(first, world));
    a = t.fit(5, false);
  }
  world->barrier();
  {
    Trainer t(second, data, null_text, at::kCPU, std::make_shared<Mesh>(second, world));
    ASSERT_TRUE(t.resume());
    EXPECT_EQ(t.steps_done(), 5);
    b = t.fit(-1, false);
  }
  if (world->rank() == 0) {
    // The first mesh's checkpoint (step 5) is in parts when it sharded.
    const std::string step5 = dir + "/resharded/checkpoints/step_00000005";
    // Meshes that cut parameters write one part per shard and tensor member (the dimensions the
    // layouts cut over); nothing is gathered.
    const int64_t S = first.parallel.shard, T = first.parallel.tensor, n = S * T;
    const bool whole = n == 1;
    for (const char* what : {"model", "ema", "optimizer"})
      for (int64_t i = 0; i < n && !whole; ++i) {
        char name[1024];
        std::snprintf(name, sizeof name, "%s/%s.part-%05lld-of-%05lld.safetensors", step5.c_str(), what,
                      (long long)i, (long long)n);
        EXPECT_TRUE(std::filesystem::exists(name)) << name;
      }
    EXPECT_EQ(std::filesystem::exists(step5 + "/model.safetensors"), whole);
    Config one = first;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir + "/single";
    one.checkpoint.every = 0;
    Trainer single(one, data, null_text);
    std::vector<double> want = single.fit(-1, false);
    a.insert(a.end(), b.begin(), b.end());
    expect_losses(a, want);
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// One run of the tiny model under FSDP: its losses, shards and what it sent in gathers.
struct GatherRun {
  std::vector<double> losses;
  TensorMap shards;
  int64_t sent = 0, fp8_weights = 0;
  double planned = 0;  // vidit plan's all-gather bytes for the weights
};

GatherRun run_gathering(const Config& cfg, std::shared_ptr<Comm> world) {
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  Trainer t(cfg, data, at::zeros({cfg.model.text_len, cfg.model.text_dim}), at::kCPU, std::make_shared<Mesh>(cfg, world));
  GatherRun r;
  r.losses = t.fit(-1, false);
  const auto& fsdp = *t.parallel_model().find<FullyShardedDataParallel>();
  for (const auto& [name, s] : fsdp.shards()) r.shards[name] = s.detach().clone();
  r.sent = fsdp.gather_sent_bytes();
  r.fp8_weights = fsdp.fp8_weights();
  r.planned = plan_step(cfg).by_purpose.at("FSDP weights");
  return r;
}

// VIDIT_GATHER_SETS (a mesh and an FP8 recipe) with the FP8 weights gathered in fp32 and in
// e4m3: the same losses and weights bit for bit, a quarter of those weights' bytes.
TEST(MpiWorker, FsdpFp8GatherEqualsGatheringFp32) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  const std::vector<std::string> base = sets_from_env(
      "VIDIT_GATHER_SETS", {"train.steps=4", "train.batch_size=4", "train.warmup_steps=1", "train.out_dir=" + dir + "/g"});
  Config fp32 = tiny_config(base), fp8 = fp32;
  fp32.parallel.fp8_all_gather = false;
  const GatherRun a = run_gathering(fp32, world);
  world->barrier();
  fp8.train.out_dir = dir + "/g8";
  const GatherRun b = run_gathering(fp8, world);
  EXPECT_EQ(a.fp8_weights, 0);
  EXPECT_EQ(b.fp8_weights, 10 * fp8.model.layers);  // every projection of every block
  EXPECT_EQ(b.losses, a.losses);
  for (const auto& [name, s] : a.shards) EXPECT_TRUE(at::equal(b.shards.at(name), s)) << name;
  // What was sent, against the plan (which leaves out the padding of each chunk to 4 bytes).
  EXPECT_LT(double(b.sent), 0.6 * double(a.sent));
  EXPECT_NEAR(double(b.sent) / double(a.sent), b.planned / a.planned, 0.02);
  if (world->rank() == 0)
    std::printf("fsdp gather (%s): fp32 %lld B sent, e4m3 for %lld weights %lld B (%.3f; plan %.3f), losses equal\n",
                std::getenv("VIDIT_GATHER_SETS"), (long long)a.sent, (long long)b.fp8_weights, (long long)b.sent,
                double(b.sent) / double(a.sent), b.planned / a.planned);
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// Weights gathered in bf16 under bf16 autocast: half the bytes, and the run stays with the one
// that gathers fp32 (autocast rounds the matmuls' weights to bf16 either way; the norms' and
// modulation's weights are rounded too).
TEST(MpiWorker, FsdpBf16GatherHalvesTheBytes) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  Config fp32 = tiny_config({"train.steps=6", "train.batch_size=4", "train.warmup_steps=1", "train.precision=\"bf16\"",
                             "parallel.shard=" + std::to_string(world->size()), "train.out_dir=" + dir + "/g"});
  Config bf16 = fp32;
  bf16.parallel.gather_dtype = Precision::bf16;
  bf16.train.out_dir = dir + "/g16";
  const GatherRun a = run_gathering(fp32, world);
  world->barrier();
  const GatherRun b = run_gathering(bf16, world);
  EXPECT_NEAR(double(b.sent) / double(a.sent), 0.5, 0.01);
  EXPECT_NEAR(b.planned / a.planned, 0.5, 1e-9);
  EXPECT_NE(b.losses, a.losses) << "the bf16 gather rounded nothing";
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(b.losses[i], a.losses[i], 0.01 * a.losses[i]) << "step " << i + 1;
  world->barrier();
  if (HasFailure()) abort_world(1);
}

void run_worker(int np, const std::string& test, const std::string& env) {
  ScratchDir dir("fsdp");
  test::expect_workers_passed(test::mpirun_worker(np, test, "VIDIT_TEST_DIR=" + dir.path() + " " + env), np);
}


class FsdpTraining : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(FsdpTraining, MatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  const test::WorkerMesh& m = GetParam();
  ScratchDir dir("fsdp");
  test::run_mesh_worker(m, "MpiWorker.FsdpTrainingMatchesOneProcess", "VIDIT_FSDP_SETS", "VIDIT_TEST_DIR=" + dir.path());
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, FsdpTraining,
    ::testing::Values(test::WorkerMesh{"Shard2", 2, "parallel.shard=2"},
                      test::WorkerMesh{"Shard4Accumulating", 4, "parallel.shard=4 train.grad_accum=2"},
                      test::WorkerMesh{"Shard2KeepingWeightsForBackward", 2, "parallel.shard=2 parallel.reshard_after_forward=false"},
                      test::WorkerMesh{"Replicate2xShard2", 4, "parallel.replicate=2 parallel.shard=2"},
                      test::WorkerMesh{"Shard2xUlysses2", 4, "parallel.shard=2 parallel.ulysses=2"},
                      test::WorkerMesh{"Shard2xRing2", 4, "parallel.shard=2 parallel.ring=2"},
                      test::WorkerMesh{"Shard2Recomputing", 2, "parallel.shard=2 train.recompute_blocks=-1"},
                      test::WorkerMesh{"Shard2RecomputingSelectively", 2,
                                       "parallel.shard=2 train.recompute_blocks=-1 train.recompute_policy=selective"}),
    test::mesh_test_name);

class FsdpFp8Gather : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(FsdpFp8Gather, EqualsGatheringFp32) {
  VIDIT_REQUIRE_MPI();
  ScratchDir dir("fsdp");
  test::run_mesh_worker(GetParam(), "MpiWorker.FsdpFp8GatherEqualsGatheringFp32", "VIDIT_GATHER_SETS",
                        "VIDIT_TEST_DIR=" + dir.path());
}

INSTANTIATE_TEST_SUITE_P(
    Mpi, FsdpFp8Gather,
    ::testing::Values(test::WorkerMesh{"Shard2Tensorwise", 2, "parallel.shard=2 train.precision=\"fp8\""},
                      test::WorkerMesh{"Shard2RowwiseAccumulatingRecomputing", 2,
                                       "parallel.shard=2 train.precision=\"fp8_rowwise\" train.grad_accum=2 "
                                       "train.recompute_blocks=1 parallel.reshard_after_forward=false"},
                      // Chunks of 1024 / 3 elements begin and end inside rows of the weights.
                      test::WorkerMesh{"Shard3RowwiseChunksCutRows", 3,
                                       "parallel.shard=3 train.batch_size=3 train.precision=\"fp8_rowwise\""},
                      test::WorkerMesh{"Shard2xTensor2Rowwise", 4,
                                       "parallel.shard=2 parallel.tensor=2 train.precision=\"fp8_rowwise\""}),
    test::mesh_test_name);

TEST(Mpi, FsdpGathersBf16WeightsForHalfTheBytes) {
  VIDIT_REQUIRE_MPI();
  run_worker(2, "MpiWorker.FsdpBf16GatherHalvesTheBytes", "");
}

TEST(Mpi, FsdpKeepsOneShardOfTheStateOn4Ranks) {
  VIDIT_REQUIRE_MPI();
  run_worker(4, "MpiWorker.FsdpKeepsOneShardOfTheState", "");
}

TEST(Mpi, CheckpointFromFsdp4ResumesAsHsdpAndAsUlysses) {
  VIDIT_REQUIRE_MPI();
  run_worker(4, "MpiWorker.FsdpCheckpointResumesAtAnotherMesh",
             "VIDIT_FIRST_SETS=parallel.shard=4 VIDIT_RESUME_SETS='parallel.replicate=2 parallel.shard=2'");
  run_worker(4, "MpiWorker.FsdpCheckpointResumesAtAnotherMesh",
             "VIDIT_FIRST_SETS=parallel.replicate=4 VIDIT_RESUME_SETS='parallel.shard=2 parallel.ulysses=2'");
}

}  // namespace
}  // namespace vidit
