#include "train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../../tests/overfit.h"
#include "../../tests/test_util.h"
#include "core/error.h"
#include "diffusion/flow_matching.h"
#include "model/state_dict.h"
#include "checkpoint/checkpoint.h"
#include "train/schedule.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

std::shared_ptr<const Dataset> synthetic(const Config& c, int64_t n = 16) {
  return std::make_shared<SyntheticDataset>(c, n, 11);
}
at::Tensor null_text(const Config& c) { return at::zeros({c.model.text_len, c.model.text_dim}); }

TEST(Trainer, OverfitsOneBatch) {
  // A fixed batch (latents, noise, sigmas, text) trained with the model, flow-matching loss,
  // clipping and AdamW of the trainer: the loss must fall at least 10x.
  const std::vector<double> losses = test::overfit_one_batch(tiny_config(), Precision::fp32, 200);
  EXPECT_LT(losses.back() * 10, losses.front()) << losses.front() << " -> " << losses.back();
}

TEST(Trainer, SameSeedSameLosses) {
  ScratchDir a("seed_a"), b("seed_b"), c2("seed_c");
  auto run = [&](const std::string& out, uint64_t seed) {
    Config c = tiny_config({"train.steps=5", "train.out_dir=\"" + out + "\"", "train.seed=" + std::to_string(seed)});
    Trainer t(c, synthetic(c), null_text(c));
    return t.fit(-1, false);
  };
  auto l1 = run(a.path(), 4), l2 = run(b.path(), 4), l3 = run(c2.path(), 5);
  EXPECT_EQ(l1, l2);
  EXPECT_NE(l1, l3);
}

TEST(Trainer, ResumeEqualsUninterruptedBitwise) {
  ScratchDir full("full"), part("part");
  std::vector<std::string> common = {"train.steps=8", "train.grad_accum=2", "train.warmup_steps=3",
                                     "diffusion.text_drop_prob=0.5"};
  auto cfg = [&](const std::string& out) {
    auto s = common;
    s.push_back("train.out_dir=\"" + out + "\"");
    return tiny_config(s);
  };
  Config cf = cfg(full.path());
  Trainer t_full(cf, synthetic(cf, 5), null_text(cf));  // 5 samples: epochs roll over mid-run
  auto losses_full = t_full.fit(-1, false);

  Config cp = cfg(part.path());
  std::vector<double> losses_part;
  {
    Trainer first(cp, synthetic(cp, 5), null_text(cp));
    losses_part = first.fit(3, false);  // stops and checkpoints at step 3
  }
  Trainer second(cp, synthetic(cp, 5), null_text(cp));
  ASSERT_TRUE(second.resume());
  EXPECT_EQ(second.steps_done(), 3);
  auto rest = second.fit(-1, false);
  losses_part.insert(losses_part.end(), rest.begin(), rest.end());
  ASSERT_EQ(losses_full.size(), losses_part.size());
  for (size_t i = 0; i < losses_full.size(); ++i) EXPECT_EQ(losses_full[i], losses_part[i]) << "step " << i + 1;
  auto pa = state_dict(*t_full.model()), pb = state_dict(*second.model());
  for (auto& [k, v] : pa) EXPECT_TRUE(at::equal(v, pb.at(k))) << k;
  for (auto& [k, v] : t_full.ema()->weights()) EXPECT_TRUE(at::equal(v, second.ema()->weights().at(k))) << k;
}

TEST(Spikes, BaselinesResumeWithTheCheckpoint) {
  // The σ-bin and gradient-norm baselines travel in the checkpoint: the steps after a resume
  // are judged against the same baselines as in the uninterrupted run, bit for bit (warm from
  // the first sample: train.spike_warmup = 1).
  ScratchDir full("spikes_full"), part("spikes_part");
  auto cfg = [&](const std::string& out) {
    return tiny_config({"train.steps=8", "train.spike_warmup=1", "train.spike_bins=2", "train.out_dir=\"" + out + "\""});
  };
  std::vector<double> z_full, z_part;
  Config cf = cfg(full.path());
  Trainer t_full(cf, synthetic(cf, 5), null_text(cf));
  t_full.fit(-1, false, [&](const StepResult& r) { z_full.push_back(r.loss_z); });
  Config cp = cfg(part.path());
  {
    Trainer first(cp, synthetic(cp, 5), null_text(cp));
    first.fit(4, false, [&](const StepResult& r) { z_part.push_back(r.loss_z); });
  }
  Trainer second(cp, synthetic(cp, 5), null_text(cp));
  ASSERT_TRUE(second.resume());
  second.fit(-1, false, [&](const StepResult& r) { z_part.push_back(r.loss_z); });
  ASSERT_EQ(z_full.size(), 8u);
  ASSERT_EQ(z_part.size(), 8u);
  for (size_t i = 0; i < z_full.size(); ++i) EXPECT_EQ(z_full[i], z_part[i]) << "step " << i + 1;
  // The resumed steps were judged (a fresh detector would give 0 at the first of them).
  EXPECT_NE(z_part[4], 0.0);
}

TEST(Checkpoint, SaveLoadIsBitwiseAndAtomic) {
  ScratchDir dir("ckpt");
  Config c = tiny_config({"train.steps=2", "checkpoint.keep=2", "train.out_dir=\"" + dir.path() + "\""});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(-1, false);
  auto latest = latest_checkpoint(dir.path());
  ASSERT_TRUE(latest);
  EXPECT_NE(latest->find("step_00000002"), std::string::npos);
  CheckpointState s = load_checkpoint(*latest);
  EXPECT_EQ(s.step, 2);
  for (auto& [k, v] : state_dict(*t.model())) EXPECT_TRUE(at::equal(v, s.model.at(k))) << k;
  EXPECT_TRUE(s.optimizer.count("rng/train"));
  EXPECT_TRUE(s.optimizer.count("exp_avg/blocks.0.ffn.0.weight"));
  Config round = parse_config(s.config_toml, "meta.json");
  EXPECT_EQ(config_to_toml(round), config_to_toml(c));

  // More saves: only `keep` remain and no temporary directory is left behind.
  t.save();
  t.save();
  int dirs = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path() + "/checkpoints")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    dirs += e.is_directory();
  }
  EXPECT_LE(dirs, 2);
  // A stale temporary directory from a crashed save does not confuse resume.
  std::filesystem::create_directories(dir.path() + "/checkpoints/step_00000009.tmp");
  Trainer r(c, synthetic(c), null_text(c));
  ASSERT_TRUE(r.resume());
  EXPECT_EQ(r.steps_done(), 2);
}

TEST(Checkpoint, CorruptFilesGiveClearErrors) {
  ScratchDir dir("ckpt_bad");
  Config c = tiny_config({"train.steps=1", "train.out_dir=\"" + dir.path() + "\""});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(-1, false);
  std::string ck = *latest_checkpoint(dir.path());
  std::filesystem::resize_file(ck + "/model.safetensors", 100);
  Trainer r(c, synthetic(c), null_text(c));
  try {
    r.resume();
    ADD_FAILURE() << "truncated checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  // A model of another shape refuses the checkpoint by key name.
  ScratchDir d2("ckpt_shape");
  Config c2 = tiny_config({"train.steps=1", "train.out_dir=\"" + d2.path() + "\""});
  Trainer t2(c2, synthetic(c2), null_text(c2));
  t2.fit(-1, false);
  Config c3 = tiny_config({"model.ffn_dim=48", "train.out_dir=\"" + d2.path() + "\""});
  Trainer r3(c3, synthetic(c3), null_text(c3));
  try {
    r3.resume();
    ADD_FAILURE() << "mis-shaped checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn.0.weight"), std::string::npos) << e.what();
  }
  // A checkpoint that does not fit the config is not corrupt: it stays where it is.
  EXPECT_EQ(checkpoint_candidates(d2.path()).size(), 1u);
  // Nor is the only checkpoint, truncated: with nothing older to fall back to, it is kept.
  EXPECT_TRUE(std::filesystem::exists(ck + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(ck + ".corrupt"));
}

// What a crash or a fallback leaves in the checkpoint directory: a step_N.old without its step_N
// (cut off between the commit's two renames) is put back; setting aside never replaces an older
// copy set aside under the same name, keeps only the newest `keep`, and points `latest` at the
// checkpoint resumed from; a format-1 checkpoint without a manifest is refused until sealed.
TEST(Checkpoint, LeftoversOfCrashesAndFallbacks) {
  ScratchDir dir("ckpt_leftovers");
  Config c = tiny_config({"train.steps=3", "checkpoint.every=1", "checkpoint.keep=3",
                          "train.out_dir=\"" + dir.path() + "\""});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(-1, false);
  const std::filesystem::path root = dir.path() + "/checkpoints";
  std::filesystem::rename(root / "step_00000003", root / "step_00000003.old");
  ASSERT_EQ(checkpoint_candidates(dir.path()).size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(root / "step_00000003" / "meta.json"));
  EXPECT_FALSE(std::filesystem::exists(root / "step_00000003.old"));

  std::filesystem::create_directories(root / "step_00000003.corrupt");
  const std::string aside = set_aside_checkpoint((root / "step_00000003").string(), (root / "step_00000002").string(), 3);
  EXPECT_EQ(aside, (root / "step_00000003.corrupt.2").string());
  EXPECT_TRUE(std::filesystem::exists(root / "step_00000003.corrupt"));
  std::ifstream latest(root / "latest");
  std::string named;
  latest >> named;
  EXPECT_EQ(named, "step_00000002");
  set_aside_checkpoint((root / "step_00000002").string(), "", 2);  // three set aside, two kept
  int kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(root))
    kept += e.path().filename().string().find(".corrupt") != std::string::npos;
  EXPECT_EQ(kept, 2);
  EXPECT_FALSE(std::filesystem::exists(root / "step_00000002.corrupt")) << "the oldest set aside is the one removed";

  // No manifest in a first-format checkpoint: refused (not corrupt) until `seal`.
  const std::filesystem::path one = root / "step_00000001";
  std::filesystem::remove(one / "manifest.json");
  std::string meta;
  {
    std::ifstream in(one / "meta.json");
    meta.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = meta.find("vidit-checkpoint-2");
  ASSERT_NE(at, std::string::npos);
  meta.replace(at, 18, "vidit-checkpoint-1");
  std::ofstream(one / "meta.json") << meta;
  EXPECT_THROW(CheckpointReader r(one.string()), CheckpointUnreadable);
  EXPECT_GT(seal_checkpoint(one.string()), 0);
  EXPECT_EQ(load_checkpoint(one.string()).step, 1);
  // The same without a manifest in the second format is damage: corrupt.
  std::filesystem::remove(one / "manifest.json");
  meta.replace(at, 18, "vidit-checkpoint-2");
  std::ofstream(one / "meta.json") << meta;
  EXPECT_THROW(CheckpointReader r(one.string()), CheckpointCorrupt);
}

// The checkpoint directory recovers by itself: a missing `latest` pointer changes nothing (the
// scan finds the newest committed checkpoint), a save killed half-way (a .tmp directory) is
// removed by the next save, saving a step again replaces it safely, and a truncated newest
// checkpoint is set aside for the one before it. Retention keeps every keep_every-th step.
TEST(Checkpoint, DirectoryRecoversByItself) {
  ScratchDir dir("ckpt_recover");
  Config c = tiny_config({"train.steps=6", "checkpoint.every=1", "checkpoint.keep=2", "checkpoint.keep_every=3",
                          "train.out_dir=\"" + dir.path() + "\""});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(4, false);
  const std::filesystem::path root = dir.path() + "/checkpoints";
  // Kept: the newest two (3 and 4); 2 and 1 are gone.
  EXPECT_TRUE(std::filesystem::exists(root / "step_00000003"));
  EXPECT_FALSE(std::filesystem::exists(root / "step_00000002"));
  std::filesystem::remove(root / "latest");
  std::filesystem::create_directories(root / "step_00000005.tmp");
  {
    Trainer r(c, synthetic(c), null_text(c));
    ASSERT_TRUE(r.resume());
    EXPECT_EQ(r.steps_done(), 4);
    r.save();  // step 4 again: replaces the committed one
    EXPECT_FALSE(std::filesystem::exists(root / "step_00000005.tmp")) << "stale .tmp left behind";
    EXPECT_FALSE(std::filesystem::exists(root / "step_00000004.old"));
  }
  std::filesystem::resize_file(root / "step_00000004" / "optimizer.safetensors", 64);
  Trainer r(c, synthetic(c), null_text(c));
  ASSERT_TRUE(r.resume());
  EXPECT_EQ(r.steps_done(), 3);
  EXPECT_TRUE(std::filesystem::exists(root / "step_00000004.corrupt"));
  // And training goes on from there, as the uninterrupted run did.
  std::vector<double> rest = r.fit(-1, false);
  EXPECT_EQ(rest.size(), 3u);
}

TEST(Checkpoint, AsynchronousSaveWritesInTheBackgroundAndEqualsTheSynchronousOne) {
  // Storage 0.3 s slower per file (fault injection) on the save of step 2: start_save() returns
  // with nothing committed, training goes on, and finish_save() commits. The checkpoint equals,
  // bit for bit, one saved synchronously at the same step.
  ScratchDir a("async_save"), b("sync_save");
  auto config = [](const std::string& out, bool async) {
    return tiny_config({"train.steps=4", "train.out_dir=\"" + out + "\"", std::string("checkpoint.async=") + (async ? "true" : "false"),
                        "faults.kind=\"slow_storage\"", "faults.step=2", "faults.seconds=0.3"});
  };
  Config ca = config(a.path(), true), cb = config(b.path(), false);
  Trainer t(ca, synthetic(ca), null_text(ca)), u(cb, synthetic(cb), null_text(cb));
  t.step(), t.step();
  t.start_save();
  EXPECT_FALSE(latest_checkpoint(a.path()).has_value()) << "the slow write cannot be done yet";
  t.step();  // training goes on while the writer writes
  const std::string dir = t.finish_save();
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(load_checkpoint(dir).step, 2);
  u.step(), u.step();
  const std::string sync_dir = u.save();
  const CheckpointState x = load_checkpoint(dir), y = load_checkpoint(sync_dir);
  for (const TensorMap* m : {&x.model, &x.ema, &x.optimizer})
    for (const auto& [key, v] : *m) {
      const TensorMap& other = m == &x.model ? y.model : m == &x.ema ? y.ema : y.optimizer;
      EXPECT_TRUE(at::equal(v, other.at(key))) << key;
    }
  // Each save is logged with how long it paused training and how long it took to write.
  std::ifstream log(a / "saves.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  EXPECT_NE(line.find("\"write_s\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"blocked_s\""), std::string::npos) << line;
}

TEST(Checkpoint, ASaveWhileThePreviousIsWrittenDoesNotWaitForIt) {
  // The save of step 2 is slow (0.3 s more per file). The save of step 3 comes while it is
  // written: it snapshots into the second set of host buffers and returns at once, with step 2
  // still not committed; both then commit, in order, and each equals, bit for bit, a synchronous
  // save of its step (had the second snapshot gone into the buffers being written, step 2's
  // checkpoint would hold step 3's state).
  ScratchDir a("double_buffer"), b("double_buffer_sync");
  auto config = [](const std::string& out, bool async) {
    return tiny_config({"train.steps=5", "checkpoint.keep=3", "train.out_dir=\"" + out + "\"",
                        std::string("checkpoint.async=") + (async ? "true" : "false"), "faults.kind=\"slow_storage\"",
                        "faults.step=2", "faults.seconds=0.3"});
  };
  Config ca = config(a.path(), true), cb = config(b.path(), false);
  Trainer t(ca, synthetic(ca), null_text(ca)), u(cb, synthetic(cb), null_text(cb));
  t.step(), t.step();
  t.start_save();
  t.step();
  t.start_save();  // step 3, while step 2 is written
  EXPECT_FALSE(latest_checkpoint(a.path()).has_value()) << "the second save waited for the first";
  t.step();
  const std::string dir3 = t.finish_save();
  ASSERT_FALSE(dir3.empty());
  EXPECT_EQ(load_checkpoint(dir3).step, 3);
  const std::string dir2 = a / "checkpoints/step_00000002";
  ASSERT_TRUE(std::filesystem::exists(dir2 + "/meta.json"));
  u.step(), u.step();
  const std::string sync2 = u.save();
  u.step();
  const std::string sync3 = u.save();
  for (const auto& [mine, theirs] : {std::pair{dir2, sync2}, std::pair{dir3, sync3}}) {
    const CheckpointState x = load_checkpoint(mine), y = load_checkpoint(theirs);
    for (const auto& [key, v] : x.model) EXPECT_TRUE(at::equal(v, y.model.at(key))) << mine << " " << key;
    for (const auto& [key, v] : x.optimizer) EXPECT_TRUE(at::equal(v, y.optimizer.at(key))) << mine << " " << key;
  }
}

TEST(Checkpoint, FailedSaveKeepsTrainingAndTheLastGoodCheckpoint) {
  // The disk fills during the save of step 2: that save fails (reported, nothing committed,
  // nothing older touched), training goes on, and the save of step 4 commits.
  ScratchDir dir("failed_save");
  // Synchronous saves: the failed one has ended when the next begins, so its leftovers are the
  // next one's to remove (an asynchronous writer still failing is left alone by that cleanup).
  Config c = tiny_config({"train.steps=4", "checkpoint.every=2", "train.out_dir=\"" + dir.path() + "\"",
                          "faults.kind=\"disk_full\"", "faults.step=2", "checkpoint.async=false"});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(-1, false);
  EXPECT_EQ(checkpoint_candidates(dir.path()), std::vector<std::string>{dir / "checkpoints/step_00000004"});
  EXPECT_FALSE(std::filesystem::exists(dir / "checkpoints/step_00000002.tmp"))
      << "the next save removes what the failed one left";
  // Too many failures in a row stop the run, naming what to do.
  ScratchDir full("failed_saves");
  Config d = tiny_config({"train.steps=2", "train.out_dir=\"" + full.path() + "\"", "checkpoint.failures_max=1",
                          "faults.kind=\"io_error\"", "faults.step=2"});
  Trainer u(d, synthetic(d), null_text(d));
  try {
    u.fit(-1, false);
    ADD_FAILURE() << "a run whose saves fail must stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.failures_max"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, TimeBasedSavesComeByTheClock) {
  // No step interval, a save every 0.005 minutes (0.3 s), steps made 0.2 s slower (fault
  // injection): saves come every second step or so, beside the final one.
  ScratchDir dir("time_saves");
  Config c = tiny_config({"train.steps=8", "checkpoint.every=0", "checkpoint.every_minutes=0.005",
                          "checkpoint.keep=20", "train.out_dir=\"" + dir.path() + "\"",
                          "faults.kind=\"slow\"", "faults.step=1", "faults.seconds=0.2"});
  Trainer t(c, synthetic(c), null_text(c));
  t.fit(-1, false);
  const std::vector<std::string> saved = checkpoint_candidates(dir.path());
  EXPECT_GE(saved.size(), 3u);
  EXPECT_LE(saved.size(), 8u);
  EXPECT_EQ(saved.front(), dir / "checkpoints/step_00000008");
}

TEST(Trainer, NonFiniteGradientSkipsTheUpdate) {
  // A NaN loss in step 3 (fault injection): the update is skipped, the weights stay finite, and
  // the run goes on; train.max_skipped_steps=0 stops it instead.
  ScratchDir dir("nan_grad");
  Config c = tiny_config({"train.steps=4", "train.out_dir=\"" + dir.path() + "\"", "faults.kind=\"nan_grad\"",
                          "faults.step=3"});
  Trainer t(c, synthetic(c), null_text(c));
  t.step(), t.step();
  const TensorMap before = t.weights();
  StepResult r = t.step();
  EXPECT_TRUE(r.skipped);
  for (const auto& [name, w] : t.weights()) EXPECT_TRUE(at::equal(w, before.at(name))) << name;
  EXPECT_FALSE(t.step().skipped);
  Config d = c;
  d.train.max_skipped_steps = 0;
  Trainer u(d, synthetic(d), null_text(d));
  u.step(), u.step();
  EXPECT_THROW(u.step(), Error);
}

TEST(Schedule, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 1.0, 10, Schedule::cosine, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(9, 100, 1.0, 10, Schedule::cosine, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(10, 100, 1.0, 10, Schedule::cosine, 0.1), 1.0);
  EXPECT_NEAR(learning_rate(55, 100, 1.0, 10, Schedule::cosine, 0.1), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(100, 100, 1.0, 10, Schedule::cosine, 0.1), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(70, 100, 1.0, 10, Schedule::constant, 0.1), 1.0);
}

TEST(AdamW, NoDecayOnNormsBiasesModulation) {
  at::Tensor w2 = at::zeros({2, 2}), w1 = at::zeros({2});
  EXPECT_FALSE(AdamW::no_decay("blocks.0.ffn.0.weight", w2));
  EXPECT_TRUE(AdamW::no_decay("blocks.0.ffn.0.bias", w1));
  EXPECT_TRUE(AdamW::no_decay("blocks.0.modulation", at::zeros({1, 6, 2})));
  EXPECT_TRUE(AdamW::no_decay("blocks.0.self_attn.norm_q.weight", w1));
  EXPECT_TRUE(AdamW::no_decay("blocks.0.norm3.weight", w1));
}

TEST(AdamW, MatchesClosedFormFirstStep) {
  // First AdamW step moves every coordinate by lr * sign(g) (bias-corrected m/sqrt(v) = g/|g|),
  // plus decoupled decay on matrices.
  at::Tensor p = at::ones({2, 2}).requires_grad_(true), b = at::ones({2}).requires_grad_(true);
  p.mutable_grad() = at::tensor({1.f, -2.f, 3.f, -4.f}).view({2, 2});
  b.mutable_grad() = at::tensor({0.5f, -0.5f});
  AdamW opt({{"w.weight", p}, {"w.bias", b}}, {0.9, 0.99, 1e-12, 0.1});
  opt.step(0.01);
  EXPECT_TRUE(at::allclose(p, at::tensor({0.989f, 1.009f, 0.989f, 1.009f}).view({2, 2}), 1e-6, 1e-6)) << p;
  EXPECT_TRUE(at::allclose(b, at::tensor({0.99f, 1.01f}), 1e-6, 1e-6)) << b;
  EXPECT_NEAR(clip_grad_norm({p}, 1.0), std::sqrt(30.0), 1e-5);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5);
}

}  // namespace
}  // namespace vidit

namespace vidit {
namespace {

TEST(Trainer, InitFromShardedWeights) {
  test::ScratchDir dir("init_from");
  Config c = test::tiny_config({"train.seed=42"});
  DiT src(c.model);
  src->init_weights();
  TensorMap all = state_dict(*src), a, b;
  for (auto& [k, v] : all) (k < "blocks.1" ? a : b)[k] = v + 0.5;  // shifted: not the init
  std::filesystem::create_directories(dir / "release");
  save_safetensors(dir / "release/model-00001-of-00002.safetensors", a);
  save_safetensors(dir / "release/model-00002-of-00002.safetensors", b);
  Config ci = test::tiny_config({"train.init_from=\"" + dir.path() + "/release\"",
                                 "train.out_dir=\"" + dir.path() + "/run\""});
  Trainer t(ci, std::make_shared<SyntheticDataset>(ci, 4, 1), at::zeros({4, 8}));
  for (auto& [k, v] : state_dict(*t.model())) EXPECT_TRUE(at::equal(v, all.at(k) + 0.5)) << k;
  // A duplicated key across shards and a missing folder are refused by name.
  save_safetensors(dir / "release/dup.safetensors", {{"head.modulation", all.at("head.modulation")}});
  EXPECT_THROW(read_weights(dir / "release"), Error);
  EXPECT_THROW(read_weights(dir / "nowhere"), Error);
}

}  // namespace
}  // namespace vidit
