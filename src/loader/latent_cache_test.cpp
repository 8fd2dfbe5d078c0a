// The latent cache on disk: round trip through shards and the merged index, resume, damaged
// bytes caught by the checksum, text references, and index conflicts.
#include "loader/latent_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;

CacheSample sample(int i) {
  CacheSample s;
  s.key = cache_key("clip" + std::to_string(i) + ".mp4", -1, -1);
  s.mean = at::randn({4, 2, 3, 5});
  s.std = at::rand({4, 2, 3, 5}) + 0.1;
  s.text = at::randn({3, 8});
  s.bucket = "5x24x40";
  s.meta = {{"source", "clip" + std::to_string(i) + ".mp4"}, {"caption", "clip " + std::to_string(i)}};
  return s;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(LatentCache, RoundTripThroughShards) {
  test::ScratchDir dir("cache_rt");
  std::vector<CacheSample> in;
  {
    // Each sample is 2 * 120 bf16 + 24 fp32 = 576 bytes: a 1 KB shard holds two.
    CacheWriter w(dir.path(), 0, 1000);
    for (int i = 0; i < 5; ++i) in.push_back(sample(i)), w.add(in.back());
  }
  EXPECT_EQ(files_in(dir / "shards").size(), 3u);
  EXPECT_EQ(merge_cache_index(dir.path()), 5);
  LatentCache cache(dir.path());
  ASSERT_EQ(cache.size(), 5);
  int found = 0;
  for (int64_t i = 0; i < cache.size(); ++i)
    for (const auto& s : in)
      if (cache.entry(i).key == s.key) {
        ++found;
        auto l = cache.load(i);
        EXPECT_TRUE(at::equal(l.mean, s.mean.to(at::kBFloat16)));
        EXPECT_TRUE(at::equal(l.std, s.std.to(at::kBFloat16)));
        EXPECT_TRUE(at::equal(l.text, s.text));
        EXPECT_EQ(cache.entry(i).bucket, "5x24x40");
        EXPECT_EQ(cache.entry(i).meta["caption"], s.meta["caption"]);
        EXPECT_EQ(cache.entry(i).shape, (std::vector<int64_t>{4, 2, 3, 5}));
      }
  EXPECT_EQ(found, 5);
  EXPECT_TRUE(cache.verify_all().empty());
}

TEST(LatentCache, RerunSkipsFinishedShardsAndRedoesTheUnfinished) {
  test::ScratchDir dir("cache_resume");
  {
    CacheWriter w(dir.path(), 3, 1000);
    for (int i = 0; i < 4; ++i) w.add(sample(i));
  }  // two shards: w003-00000 (0, 1) and w003-00001 (2, 3)
  // A crash after the second shard but before its index part: only the first shard counts.
  fs::remove(dir / "index/w003-00001.jsonl");
  CacheWriter again(dir.path(), 3, 1000);
  EXPECT_EQ(again.done().size(), 2u);
  EXPECT_TRUE(again.done().count(sample(0).key));
  EXPECT_FALSE(again.done().count(sample(2).key));
  for (int i = 0; i < 4; ++i) again.add(sample(i));  // 0 and 1 are skipped
  again.flush();
  EXPECT_EQ(again.samples_written(), 2);
  EXPECT_EQ(merge_cache_index(dir.path()), 4);
  // Another worker writing the same cache sees every finished key too.
  CacheWriter other(dir.path(), 4, 1000);
  EXPECT_EQ(other.done().size(), 4u);
}

// A key written again at a later revision (a re-captioned clip) replaces the earlier one in the
// writer's view, the merged index and the cache; the same key at the same revision in two parts
// is still an error.
TEST(LatentCache, ALaterRevisionOfAKeyReplacesTheEarlier) {
  test::ScratchDir dir("cache_revisions");
  {
    CacheWriter w(dir.path(), 0, 1 << 20, at::kFloat);
    for (int i = 0; i < 2; ++i) w.add(sample(i));
  }
  CacheSample again = sample(0);
  again.text = at::full({3, 8}, 7.0);
  again.meta["caption"] = "a new caption";
  {
    CacheWriter w(dir.path(), 1, 1 << 20, at::kFloat);
    EXPECT_EQ(w.done().at(again.key).rev, 0);
    EXPECT_EQ(w.done().at(again.key).caption_digest, caption_digest("clip 0"));
    w.add(again);  // revision 0 again: dropped
    w.flush();
    EXPECT_EQ(w.samples_written(), 0);
    again.rev = 1;
    w.add(again);
    w.flush();
    EXPECT_EQ(w.samples_written(), 1);
    EXPECT_EQ(w.cached_entry(again.key).meta["caption"], "a new caption");
    const CacheSample back = read_cached_sample(dir.path(), w.cached_entry(again.key));
    EXPECT_TRUE(at::equal(back.text, again.text));
    EXPECT_EQ(back.rev, 1);
  }
  EXPECT_EQ(CacheWriter(dir.path(), 2, 1 << 20).done().at(again.key).rev, 1);
  EXPECT_EQ(merge_cache_index(dir.path()), 2);  // not 3: one entry per key
  LatentCache cache(dir.path());
  ASSERT_EQ(cache.size(), 2);
  for (int64_t i = 0; i < cache.size(); ++i)
    if (cache.entry(i).key == again.key) {
      EXPECT_EQ(cache.entry(i).rev, 1);
      EXPECT_TRUE(at::equal(cache.load(i).text, again.text));
    }
  // The same key at the same revision in another part: refused, naming both parts.
  {
    CacheWriter w(dir.path(), 3, 1 << 20, at::kFloat);
    CacheSample dup = sample(1);
    dup.rev = 1;
    w.add(dup);  // revision 1 of clip 1 (whose latest is 0): written
  }
  {
    CacheWriter w(dir.path(), 4, 1 << 20, at::kFloat);
    EXPECT_EQ(w.done().at(sample(1).key).rev, 1);
  }
  fs::copy_file(dir / "index/w003-00000.jsonl", dir / "index/w005-00000.jsonl");
  try {
    merge_cache_index(dir.path());
    FAIL() << "a key twice at one revision was merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("revision 1"), std::string::npos) << e.what();
  }
}

TEST(LatentCache, DamagedBytesFailTheChecksum) {
  test::ScratchDir dir("cache_corrupt");
  {
    CacheWriter w(dir.path(), 0, 1 << 20, at::kFloat);
    for (int i = 0; i < 3; ++i) w.add(sample(i));
  }
  merge_cache_index(dir.path());
  // Flip one byte of the last tensor in the single shard.
  const std::string shard = dir / ("shards/" + files_in(dir / "shards")[0]);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-3, std::ios::end);
    f.put(char(c ^ 0x5a));
  }
  LatentCache cache(dir.path());
  auto bad = cache.verify_all();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("checksum"), std::string::npos) << bad[0];
  int failures = 0;
  for (int64_t i = 0; i < cache.size(); ++i) {
    try {
      cache.load(i);
    } catch (const CacheCorruption& e) {
      ++failures;
      EXPECT_NE(std::string(e.what()).find(cache.entry(i).key), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(failures, 1);
}

TEST(LatentCache, TextReferencesAndMissingShards) {
  test::ScratchDir dir("cache_textref");
  at::Tensor emb = at::randn({7, 16});
  save_safetensors(dir / "emb0.safetensors", {{"text", emb}});
  {
    CacheWriter w(dir.path(), 0, 1 << 20);
    CacheSample s = sample(0);
    s.text = at::Tensor();
    s.text_ref = dir / "emb0.safetensors";
    w.add(s);
    CacheSample both = sample(1);
    both.text_ref = "x.safetensors";
    EXPECT_THROW(w.add(both), Error);
  }
  LatentCache cache(dir.path());  // no merged index: the parts are read directly
  ASSERT_EQ(cache.size(), 1);
  EXPECT_TRUE(at::equal(cache.load(0).text, emb));
  for (const auto& f : files_in(dir / "shards")) fs::remove(dir / ("shards/" + f));
  LatentCache gone(dir.path());
  try {
    gone.load(0);
    FAIL() << "a missing shard loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shards/w000-00000.safetensors"), std::string::npos) << e.what();
  }
}

TEST(LatentCache, AKeyInTwoIndexPartsIsAnError) {
  test::ScratchDir dir("cache_dup");
  {
    CacheWriter w(dir.path(), 0, 1 << 20);
    w.add(sample(0));
  }
  fs::copy_file(dir / "index/w000-00000.jsonl", dir / "index/w001-00000.jsonl");
  try {
    merge_cache_index(dir.path());
    FAIL() << "duplicate key merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(sample(0).key), std::string::npos) << e.what();
  }
  EXPECT_THROW(LatentCache(dir / "nope"), Error);
}

}  // namespace
}  // namespace vidit
