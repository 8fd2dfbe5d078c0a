// `vidit prepare` end to end on real files made by the ffmpeg CLI: two worker processes share a
// manifest with good clips in several shapes and every kind of unusable input; the cache holds
// the good ones in their buckets, rejects.jsonl names each bad one with its reason, a rerun skips
// everything, --verify catches a damaged shard, and the loader and `vidit train` read the cache.
// (Two ranks resuming training on the cache are tested in src/train/cache_resume_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/cache_loader.h"
#include "loader/latent_cache.h"
#include "prepare/prepared_cache_test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using prepare_test::PreparedCache;
using prepare_test::run;

using prepare_test::read_jsonl;

TEST(Prepare, TwoWorkersCacheTheGoodClipsAndRejectTheRest) {
  SKIP_WITHOUT_DECODING();
  PreparedCache p;
  // Two real worker processes, each on its own slice; the last to finish merges.
  const std::string log = p.dir / "prepare.log";
  ASSERT_EQ(run("(" + p.vidit("prepare --worker 0 --workers 2") + " & " + p.vidit("prepare --worker 1 --workers 2") +
                " & wait) > " + log + " 2>&1"),
            0);
  const std::string cache = p.dir / "cache";
  ASSERT_TRUE(fs::exists(cache + "/index.jsonl")) << "no merged index; log in " << log;
  auto index = read_jsonl(cache + "/index.jsonl");
  ASSERT_EQ(index.size(), 4u);
  std::set<std::string> buckets, captions;
  for (const auto& e : index) {
    buckets.insert(e["bucket"].get<std::string>());
    captions.insert(e["meta"]["caption"].get<std::string>());
    EXPECT_EQ(e["bucket"].get<std::string>().substr(0, 2), "9x") << "12-frame clips take the 9-frame buckets";
  }
  EXPECT_EQ(buckets.size(), 3u) << "landscape, portrait and wide clips share a bucket";
  EXPECT_EQ(captions.size(), 4u);
  auto rejects = read_jsonl(cache + "/rejects.jsonl");
  ASSERT_EQ(rejects.size(), p.bad.size() + 1) << "each bad input once, plus the broken manifest line";
  std::map<std::string, std::string> why;
  for (const auto& r : rejects) why[fs::path(r["input"].get<std::string>()).filename().string()] = r["reason"];
  for (const auto& f : p.bad) EXPECT_TRUE(why.count(f)) << f << " is not in rejects.jsonl";
  EXPECT_NE(why["short.mp4"].find("too short"), std::string::npos) << why["short.mp4"];
  EXPECT_NE(why["tiny.mp4"].find("too small"), std::string::npos) << why["tiny.mp4"];
  for (std::string f : {"truncated.mp4", "random.mp4", "empty.mp4", "audio.m4a", "missing.mp4"})
    EXPECT_NE(why[f].find(f), std::string::npos) << "the reason should name the file: " << why[f];

  // A rerun finds everything cached and writes nothing new.
  const std::string again = p.dir / "again.log";
  ASSERT_EQ(run(p.vidit("prepare") + " > " + again + " 2>&1"), 0);
  std::ifstream in(again);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("0 written, 4 already cached"), std::string::npos) << text;
  EXPECT_EQ(read_jsonl(cache + "/index.jsonl").size(), 4u);
  EXPECT_EQ(run(p.vidit("prepare --verify") + " > /dev/null"), 0);

  // The loader: an epoch of single-bucket batches covering the 4 samples once.
  Config cfg = load_config(p.config);
  auto lc = std::make_shared<LatentCache>(cache);
  {
    CacheLoader loader(lc, cfg);
    std::multiset<std::string> shapes;
    int64_t seen = 0;
    while (seen < 4) {
      MicroBatch b = loader.next();
      ASSERT_GT(b.latents.size(0), 0);
      EXPECT_EQ(b.latents.size(1), 12);
      EXPECT_EQ(b.texts.sizes(), (std::vector<int64_t>{b.latents.size(0), cfg.model.text_len, cfg.model.text_dim}));
      seen += b.latents.size(0);
    }
    EXPECT_EQ(seen, 4);
    EXPECT_EQ(loader.state().epoch, 0);
  }
  // Training reads the cache through the same loader.
  ASSERT_EQ(run(p.vidit("train") + " > " + (p.dir / "train.log") + " 2>&1"), 0) << "see " << (p.dir / "train.log");

  // A damaged shard: --verify fails, the loader skips the sample and says so.
  std::string shard;
  for (const auto& e : fs::directory_iterator(cache + "/shards")) shard = e.path().string();
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_EQ(run(p.vidit("prepare --verify") + " > /dev/null"), 4);
  CacheLoader loader(std::make_shared<LatentCache>(cache), cfg);
  int64_t got = 0;
  for (int i = 0; i < 4; ++i) got += loader.next().latents.size(0);
  EXPECT_LT(got, 8);
  EXPECT_FALSE(loader.skipped().empty());
}

TEST(Prepare, LoaderResumesExactly) {
  SKIP_WITHOUT_DECODING();
  PreparedCache p;
  ASSERT_EQ(run(p.vidit("prepare") + " > /dev/null 2>&1"), 0);
  Config cfg = load_config(p.config);
  auto cache = std::make_shared<LatentCache>(p.dir / "cache");
  CacheLoader full(cache, cfg);
  std::vector<at::Tensor> expect;
  for (int i = 0; i < 7; ++i) expect.push_back(full.next().latents);
  CacheLoader first(cache, cfg);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(first.next().latents, expect[size_t(i)]));
  const SamplerState saved = first.state();
  CacheLoader second(cache, cfg);
  second.set_state(saved);
  for (int i = 3; i < 7; ++i) EXPECT_TRUE(at::equal(second.next().latents, expect[size_t(i)])) << "batch " << i;
}

}  // namespace
}  // namespace vidit
