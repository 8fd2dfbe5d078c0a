// Checkpoint memory chosen by the run (checkpoint.snapshots) and the memory plan checked at
// start: the snapshot buffers are allocated and touched when the trainer is built, so a save
// allocates nothing new; one set or none still save checkpoints equal to the default's; a run
// whose plan does not fit the node is refused before any work, naming the phase and the key.
#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/host_peak.h"
#include "loader/dataset.h"
#include "parallel/plan.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

Config config(const std::string& out, int64_t sets, bool async = true) {
  return tiny_config({"train.steps=4", "model.dim=64", "model.ffn_dim=256", "model.layers=3",
                      "train.out_dir=\"" + out + "\"", "checkpoint.snapshots=" + std::to_string(sets),
                      std::string("checkpoint.async=") + (async ? "true" : "false")});
}

Trainer make(const Config& c) {
  return Trainer(c, std::make_shared<SyntheticDataset>(c, 16, 3), at::zeros({c.model.text_len, c.model.text_dim}));
}

TEST(Snapshots, BuffersAreTakenAtStartSoASaveAllocatesNothingNew) {
  ScratchDir dir("snapshots");
  const Config c = config(dir.path(), 2);
  Trainer t = make(c);
  // Two sets of weights, EMA and AdamW (the plan's figure, to the byte but for the scalars).
  const StepPlan plan = plan_step(c);
  EXPECT_NEAR(double(t.snapshot_bytes()), plan.snapshots, 0.01 * plan.snapshots);
  EXPECT_GT(t.snapshot_bytes(), 100 << 10);
  t.step();
  for (int i = 0; i < 2; ++i) {  // the first two saves fill the two sets
    HostPeak peak;
    ASSERT_FALSE(t.save().empty());
    EXPECT_LT(peak.peak(), t.snapshot_bytes() / 20) << "save " << i << " allocated its snapshot";
    t.step();
  }
}

TEST(Snapshots, OneSetOrNoneSaveWhatTwoSave) {
  std::vector<CheckpointState> saved;
  for (int64_t sets : {2, 1, 0}) {
    ScratchDir dir("snapshots_" + std::to_string(sets));
    Trainer t = make(config(dir.path(), sets));
    EXPECT_EQ(t.snapshot_bytes() > 0, sets > 0);
    t.step();
    t.start_save();  // with one set the next save waits for this one; with none it is written now
    if (sets == 0) EXPECT_TRUE(latest_checkpoint(dir.path()).has_value()) << "no buffers: written before training goes on";
    t.step();
    t.start_save();
    ASSERT_FALSE(t.finish_save().empty());
    saved.push_back(load_checkpoint(*latest_checkpoint(dir.path())));
    EXPECT_EQ(saved.back().step, 2);
  }
  for (size_t k = 1; k < saved.size(); ++k)
    for (const auto& [key, v] : saved[0].optimizer)
      if (key.rfind("exp_avg", 0) == 0) EXPECT_TRUE(at::equal(v, saved[k].optimizer.at(key))) << key << " set " << k;
  for (size_t k = 1; k < saved.size(); ++k)
    for (const auto& [key, v] : saved[0].model) EXPECT_TRUE(at::equal(v, saved[k].model.at(key))) << key;
}

TEST(MemoryPlan, ARunThatDoesNotFitTheNodeIsRefusedAtStart) {
  ScratchDir dir("no_fit");
  Config c = config(dir.path(), 2);
  c.train.host_memory_gb = 0.1;  // less than the runtime alone (120 MiB)
  const std::string err = test::message_of([&] { make(c); });
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
  EXPECT_NE(err.find("train.host_memory_gb"), std::string::npos) << err;
  EXPECT_NE(err.find("parallel.shard"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir / "checkpoints")) << "a refused run wrote nothing";
  c.train.host_memory_gb = 64;
  EXPECT_NO_THROW(make(c));
}

}  // namespace
}  // namespace vidit
