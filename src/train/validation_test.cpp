// The validation split and loss: held-out clips never train and are chosen by key alone; the
// loss of the same weights is the same figure at any world size (real ranks under mpirun, data
// parallel and FSDP) and across a restart, logged to metrics.jsonl and TensorBoard per noise
// level and per bucket; bad splits are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "loader/cache_loader.h"
#include "loader/validation_split.h"
#include "prepare/prepared_cache_test_util.h"
#include "train/trainer.h"
#include "train/validation.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using prepare_test::PreparedCache;
using prepare_test::read_jsonl;
using prepare_test::run;

// A cache of `n` clips with fixed keys ("clip000", ...) in two buckets, shaped for tiny_config.
void write_cache(const std::string& dir, int n) {
  CacheWriter w(dir, 0, 1 << 20, at::kFloat);
  for (int i = 0; i < n; ++i) {
    CacheSample s;
    char key[16];
    std::snprintf(key, sizeof key, "clip%03d", i);
    s.key = key;
    const int64_t h = i % 2 ? 4 : 6;
    s.mean = at::randn({4, 2, h, 4});
    s.std = at::full({4, 2, h, 4}, 0.01);
    s.text = at::randn({4, 8});
    s.bucket = "2x" + std::to_string(h) + "x4";
    s.meta = {{"caption", s.key}};
    w.add(s);
  }
  w.flush();
  merge_cache_index(dir);
}

TEST(ValidationSplit, HeldOutByKeyNeverTrains) {
  test::ScratchDir dir("val_split");
  write_cache(dir.path(), 40);
  auto cache = std::make_shared<const LatentCache>(dir.path());
  Config cfg = test::tiny_config({"data.source=\"cache\"", "data.cache_dir=\"" + dir.path() + "\"",
                                  "data.val_fraction=0.25", "train.val_samples=6", "data.loader_threads=1"});
  std::set<std::string> held;
  for (int64_t i = 0; i < cache->size(); ++i)
    if (held_out(cache->entry(i).key, 0.25)) held.insert(cache->entry(i).key);
  // The keys are fixed, so the split is: a part, neither none nor all.
  ASSERT_GT(held.size(), 0u);
  ASSERT_LT(held.size(), 40u);
  // A larger fraction holds out a superset: a clip never changes sides as the fraction grows.
  for (const auto& k : held) EXPECT_TRUE(held_out(k, 0.5)) << k;
  EXPECT_FALSE(held_out("clip000", 0));

  // The loader hands out every other clip, over epochs, and never a held-out one.
  std::set<std::string> trained;
  {
    CacheLoader loader(cache, cfg);
    for (int b = 0; b < 60; ++b)
      for (const auto& id : loader.next().ids) trained.insert(nlohmann::json::parse(id)["key"].get<std::string>());
  }
  EXPECT_EQ(trained.size() + held.size(), 40u);
  for (const auto& k : trained) EXPECT_EQ(held.count(k), 0u) << k << " is held out but trained";

  // The clips evaluated: held-out ones, at most train.val_samples, in an order fixed by the keys.
  auto set = validation_set(cfg, cache);
  ASSERT_TRUE(set.has_value());
  EXPECT_EQ(set->held_out, int64_t(held.size()));
  EXPECT_EQ(set->indices.size(), std::min<size_t>(6, held.size()));
  for (int64_t i : set->indices) EXPECT_EQ(held.count(cache->entry(i).key), 1u);
  EXPECT_EQ(validation_set(cfg, cache)->indices, set->indices);

  // No validation without a fraction or a cache of its own, or with train.val_every = 0.
  Config off = cfg;
  off.data.val_fraction = 0;
  EXPECT_FALSE(validation_set(off, cache).has_value());
  off = cfg;
  off.train.val_every = 0;
  EXPECT_FALSE(validation_set(off, cache).has_value());

  // A split that would hold out nothing, or everything, is refused naming the cache.
  Config none = cfg;
  none.data.val_fraction = 1e-9;
  EXPECT_NE(test::message_of([&] { validation_set(none, cache); }).find("holds out none of the 40 clips"),
            std::string::npos);
  Config all = cfg;
  all.data.val_fraction = 0.999999;
  const std::string why = test::message_of([&] { CacheLoader l(cache, all); });
  EXPECT_NE(why.find("holds out all 40 clips"), std::string::npos) << why;
  EXPECT_NE(why.find(dir.path()), std::string::npos) << why;
  // Whole-cache fractions, both kinds at once, and noise levels outside (0, 1) are refused by key.
  EXPECT_NE(test::message_of([] { test::tiny_config({"data.source=\"cache\"", "data.cache_dir=\"c\"", "data.val_fraction=1"}); })
                .find("data.val_fraction = 1"),
            std::string::npos);
  EXPECT_NE(test::message_of([] {
              test::tiny_config({"data.source=\"cache\"", "data.cache_dir=\"c\"", "data.val_fraction=0.1",
                                 "data.val_cache=\"v\""});
            }).find("keep one"),
            std::string::npos);
  EXPECT_NE(test::message_of([] { test::tiny_config({"train.val_sigmas=[0.5, 1.0]"}); }).find("train.val_sigmas holds 1"),
            std::string::npos);
  EXPECT_NE(test::message_of([] { test::tiny_config({"data.val_fraction=0.1"}); }).find("synthetic"),
            std::string::npos);
  // A held-out clip the model cannot take (other latent channels) is named before any step.
  {
    test::ScratchDir odd("val_odd");
    CacheWriter w(odd.path(), 0, 1 << 20, at::kFloat);
    CacheSample c;
    c.key = "odd";
    c.mean = at::randn({3, 2, 4, 4}), c.std = at::zeros({3, 2, 4, 4}), c.text = at::randn({4, 8}), c.bucket = "2x4x4";
    w.add(c);
    w.flush();
    merge_cache_index(odd.path());
    Config with_odd = cfg;
    with_odd.data.val_fraction = 0, with_odd.data.val_cache = odd.path();
    const std::string why_odd = test::message_of([&] { Validator(with_odd, *validation_set(with_odd, cache), at::kCPU); });
    EXPECT_NE(why_odd.find("clip 'odd'"), std::string::npos) << why_odd;
    EXPECT_NE(why_odd.find("model.out_channels is 4"), std::string::npos) << why_odd;
  }
  // An empty cache of its own is named.
  test::ScratchDir empty("val_empty");
  Config own = cfg;
  own.data.val_fraction = 0, own.data.val_cache = empty.path();
  const std::string no_clips = test::message_of([&] { validation_set(own, cache); });
  EXPECT_NE(no_clips.find(empty.path()), std::string::npos) << no_clips;
}

// In one process: the figure is a function of the weights (evaluated twice, the same bits), each
// noise level and bucket is reported, and one expert is validated at its noise levels only.
TEST(Validation, FigureDependsOnTheWeightsAlone) {
  test::ScratchDir dir("val_fig");
  write_cache(dir / "cache", 12);
  Config cfg = test::tiny_config({"data.source=\"cache\"", "data.cache_dir=\"" + (dir / "cache") + "\"",
                                  "data.val_fraction=0.5", "train.val_every=2", "train.steps=4",
                                  "train.out_dir=\"" + (dir / "run") + "\"", "train.warmup_steps=1"});
  auto cache = std::make_shared<const LatentCache>(cfg.data.cache_dir);
  auto loader = std::make_shared<CacheLoader>(cache, cfg);
  Trainer trainer(cfg, loader, at::zeros({cfg.model.text_len, cfg.model.text_dim}));
  trainer.set_validator(std::make_unique<Validator>(cfg, *validation_set(cfg, cache), at::kCPU));
  const ValidationMetrics a = trainer.validate(), b = trainer.validate();
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.by_sigma.size(), 5u);
  EXPECT_EQ(a.by_sigma[0].first, 0.1);
  EXPECT_GT(a.clips, 0);
  EXPECT_FALSE(a.by_bucket.empty());
  double mean = 0;
  for (const auto& [s, l] : a.by_sigma) mean += l / 5;
  EXPECT_NEAR(a.loss, mean, 1e-12);
  trainer.fit(-1, /*console=*/false);
  // fit() validated at steps 0 (the start), 2 and 4, each a line of metrics.jsonl.
  std::vector<int64_t> steps;
  double last = 0;
  for (const auto& j : read_jsonl(dir / "run/metrics.jsonl"))
    if (j.contains("val_loss")) steps.push_back(j["step"].get<int64_t>()), last = j["val_loss"].get<double>();
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 2, 4}));
  const ValidationMetrics c = trainer.validate();
  EXPECT_NE(c.loss, a.loss);  // trained weights give another figure
  EXPECT_EQ(c.loss, last);    // the same as fit() logged for them
  // Resumed with another split: warned, since clips held out now may have trained before.
  {
    Config other = cfg;
    other.data.val_fraction = 0.3;
    Trainer again(other, std::make_shared<CacheLoader>(cache, other), at::zeros({cfg.model.text_len, cfg.model.text_dim}));
    testing::internal::CaptureStderr();
    ASSERT_TRUE(again.resume());
    const std::string warned = testing::internal::GetCapturedStderr();
    EXPECT_NE(warned.find("was saved with another validation split (data.val_fraction 0.5"), std::string::npos) << warned;
  }

  // The high-noise expert of a two-expert model: only its noise levels.
  Config high = cfg;
  high.model.boundary = 0.6, high.train.expert = Expert::high;
  Validator v(high, *validation_set(high, cache), at::kCPU);
  EXPECT_EQ(v.sigmas(), (std::vector<double>{0.7, 0.9}));
  high.train.val_sigmas = {0.1, 0.3};
  EXPECT_NE(test::message_of([&] { Validator(high, *validation_set(high, cache), at::kCPU); }).find("train.val_sigmas"),
            std::string::npos);
}

// The value of `key` in each validation line of `run`'s metrics.jsonl, by step, as JSON text
// (doubles print round-trip exact).
std::map<int64_t, std::string> val_lines(const std::string& run) {
  std::map<int64_t, std::string> out;
  for (auto j : read_jsonl(run + "/metrics.jsonl"))
    if (j.contains("val_loss")) {
      j.erase("val_seconds");
      out[j["step"].get<int64_t>()] = j.dump();
    }
  return out;
}

// Real jobs on a cache made by vidit prepare, validated on a cache of their own: the validation
// of the same weights (the start's) is the same figure in one process and on two ranks, data
// parallel and FSDP; a two-rank run stopped and resumed logs the validations of the uninterrupted
// one bit for bit; TensorBoard holds the bands.
TEST(Validation, SameFigureAtAnyWorldSizeAndAcrossARestart) {
  SKIP_WITHOUT_DECODING();
  VIDIT_REQUIRE_MPI();
  PreparedCache p;
  ASSERT_EQ(run(p.vidit("prepare") + " > /dev/null 2>&1"), 0);
  // The held-out videos: two of the clips, prepared into a cache of their own.
  {
    std::ofstream m(p.dir / "val.jsonl");
    for (std::string f : {"land.mp4", "wide.webm"})
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", "held out " + f}}.dump() << "\n";
  }
  const std::string val = p.dir / "val_cache";
  ASSERT_EQ(run(p.vidit("prepare") + " --set data.manifest=\"" + (p.dir / "val.jsonl") + "\" data.cache_dir=\"" + val +
                "\" > /dev/null 2>&1"),
            0);
  const std::string sets = " --set train.steps=6 train.warmup_steps=1 train.val_every=3 data.val_cache=\"" + val +
                           "\" train.out_dir=";
  auto one = test::run_process(p.vidit("train") + sets + (p.dir / "one"));
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_NE(one.output.find("validation: 2 of 2 held-out clips"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("[val] step 3: loss"), std::string::npos) << one.output;
  auto dp = test::mpirun(2, p.vidit("train") + sets + (p.dir / "dp") + " parallel.replicate=2", 180);
  ASSERT_EQ(dp.status, 0) << dp.output;
  auto fsdp = test::mpirun(2, p.vidit("train") + sets + (p.dir / "fsdp") + " parallel.shard=2", 180);
  ASSERT_EQ(fsdp.status, 0) << fsdp.output;
  const auto a = val_lines(p.dir / "one"), b = val_lines(p.dir / "dp"), c = val_lines(p.dir / "fsdp");
  ASSERT_EQ(a.size(), 3u);  // steps 0, 3, 6
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  // The start's weights are the same at any world size: so is their validation, bit for bit.
  EXPECT_EQ(b.at(0), a.at(0));
  EXPECT_EQ(c.at(0), a.at(0));
  const auto first = nlohmann::json::parse(a.at(0));
  EXPECT_EQ(first["val_clips"], 2);
  EXPECT_EQ(first["val_loss_by_sigma"].size(), 5u);
  EXPECT_TRUE(first["val_loss_by_sigma"].contains("0.5"));
  EXPECT_FALSE(first["val_loss_by_bucket"].empty());

  // Stopped after 3 steps and resumed: the same validations as the uninterrupted two-rank run.
  auto part = test::mpirun(2, p.vidit("train --max-steps 3") + sets + (p.dir / "parts") + " parallel.replicate=2", 180);
  ASSERT_EQ(part.status, 0) << part.output;
  auto rest = test::mpirun(2, p.vidit("train --resume") + sets + (p.dir / "parts") + " parallel.replicate=2", 180);
  ASSERT_EQ(rest.status, 0) << rest.output;
  EXPECT_EQ(val_lines(p.dir / "parts"), b);

  // TensorBoard: the overall figure, each band and each bucket.
  std::string events;
  for (const auto& e : fs::directory_iterator(p.dir / "one/tb")) {
    std::ifstream in(e.path(), std::ios::binary);
    events += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  for (const char* tag : {"val/loss", "val/loss_by_sigma/0.10", "val/loss_by_sigma/0.90", "val/loss_by_bucket/"})
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  // vidit doctor names the last validation.
  auto doc = test::run_process(std::string(VIDIT_BINARY) + " doctor " + (p.dir / "one"));
  EXPECT_NE(doc.output.find("validation: loss"), std::string::npos) << doc.output;
}

}  // namespace
}  // namespace vidit
