// The step plan: memory per rank falls as 1/shard; a memory budget picks the least
// recomputation that fits; only valid meshes are listed. (The bytes a real step sends against
// the plan's are tested in src/train/step_comm_test.cpp.)
#include "parallel/plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace vidit {
namespace {

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

}  // namespace
}  // namespace vidit
