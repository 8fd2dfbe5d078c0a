// `vidit prepare` from WebDataset tar shards, as a team ships video at scale: the same videos as
// loose files and packed into shards (by the tar program) give the same cache entries, bit for
// bit; each shard is one worker's unit of work; a bad video, a key without a video and a shard cut
// short are each a named reject while the rest carries on; a rerun finds everything cached; and
// cutting members into clips (data.clip_seconds: their length probed through the shard) gives the
// loose files' clips.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loader/latent_cache.h"
#include "prepare/prepared_cache_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using prepare_test::PreparedCache;
using prepare_test::run;

using prepare_test::read_jsonl;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Caption -> the cached latent mean of the cache at `dir`.
std::map<std::string, at::Tensor> means_by_caption(const std::string& dir) {
  const LatentCache c(dir);
  std::map<std::string, at::Tensor> out;
  for (int64_t i = 0; i < c.size(); ++i) out[c.entry(i).meta.at("caption").get<std::string>()] = c.load(i).mean.clone();
  return out;
}

TEST(WebDatasetPrepare, ShardsGiveWhatLooseFilesGiveOneShardPerWorker) {
  SKIP_WITHOUT_DECODING();
  PreparedCache p;
  const std::string stage = p.dir / "stage", shards = p.dir / "shards";
  fs::create_directories(stage);
  fs::create_directories(shards);
  for (const std::string f : {"land.mp4", "port.mp4", "wide.webm", "land2.mp4", "random.mp4", "short.mp4"}) {
    fs::copy_file(p.dir / ("videos/" + f), stage + "/" + f);
    const std::string key = f.substr(0, f.find('.'));
    std::ofstream(stage + "/" + key + ".txt") << (p.caption_of.count(f) ? p.caption_of.at(f) : "bad " + key) << "\n";
  }
  std::ofstream(stage + "/orphan.txt") << "a caption without its video\n";
  // s0: two good videos and one that is not a video; s1: two good ones and a caption alone; s2:
  // a shard cut short in its only video.
  ASSERT_EQ(run("tar -cf " + shards + "/s0.tar -C " + stage + " land.mp4 land.txt port.mp4 port.txt random.mp4 random.txt"), 0);
  ASSERT_EQ(run("tar -cf " + shards + "/s1.tar -C " + stage + " wide.webm wide.txt land2.mp4 land2.txt orphan.txt"), 0);
  ASSERT_EQ(run("tar -cf " + stage + "/s2.tar -C " + stage + " short.txt short.mp4"), 0);
  const std::string whole = read_text(stage + "/s2.tar");
  std::ofstream(shards + "/s2.tar", std::ios::binary) << whole.substr(0, 1024 + 700);

  // The loose files (manifest.jsonl) as the reference.
  ASSERT_EQ(run(p.vidit("prepare") + " > " + (p.dir / "loose.log") + " 2>&1"), 0) << read_text(p.dir / "loose.log");
  // The shards by a brace pattern, two workers: shard k goes whole to worker k % 2.
  const std::string tar_cache = p.dir / "cache_tar";
  const std::string sets = " --set 'data.manifest=\"" + shards + "/s{0..2}.tar\"' --set 'data.cache_dir=\"" + tar_cache + "\"'";
  for (int w : {0, 1})
    ASSERT_EQ(run(p.vidit("prepare --worker " + std::to_string(w) + " --workers 2" + sets) + " > " + (p.dir / "tar.log") +
                  " 2>&1"), 0) << read_text(p.dir / "tar.log");
  ASSERT_TRUE(fs::exists(tar_cache + "/index.jsonl")) << read_text(p.dir / "tar.log");
  const auto loose = means_by_caption(p.dir / "cache"), packed = means_by_caption(tar_cache);
  ASSERT_EQ(loose.size(), 4u);
  ASSERT_EQ(packed.size(), 4u);
  for (const auto& [caption, mean] : loose) {
    ASSERT_TRUE(packed.count(caption)) << caption;
    EXPECT_TRUE(at::equal(packed.at(caption), mean)) << caption << ": not the loose file's latents";
  }
  for (const auto& e : read_jsonl(tar_cache + "/index.jsonl"))
    EXPECT_NE(e["meta"]["source"].get<std::string>().find(".tar/"), std::string::npos) << e.dump();
  // Worker 0 took s0 and s2 (3 samples; s2's was lost with its end), worker 1 s1 (2).
  EXPECT_EQ(nlohmann::json::parse(read_text(tar_cache + "/done/w000")).at("entries"), 3);
  EXPECT_EQ(nlohmann::json::parse(read_text(tar_cache + "/done/w001")).at("entries"), 2);

  // Each unusable thing once, by shard and member.
  std::map<std::string, std::string> why;
  for (const auto& r : read_jsonl(tar_cache + "/rejects.jsonl"))
    why[r.value("where", std::string()) + "|" + r.value("input", std::string())] = r.value("reason", std::string());
  auto find = [&](const std::string& part) {
    for (const auto& [k, v] : why)
      if (k.find(part) != std::string::npos) return v;
    return std::string();
  };
  EXPECT_NE(find("s0.tar/random.mp4"), "") << nlohmann::json(why).dump(1);
  EXPECT_NE(find("orphan"), "") << nlohmann::json(why).dump(1);
  EXPECT_NE(find("s2.tar"), "") << nlohmann::json(why).dump(1);
  EXPECT_EQ(why.size(), 3u) << nlohmann::json(why).dump(1);

  // A rerun (one process) finds every clip cached.
  ASSERT_EQ(run(p.vidit("prepare" + sets) + " > " + (p.dir / "again.log") + " 2>&1"), 0);
  EXPECT_NE(read_text(p.dir / "again.log").find("0 written, 4 already cached"), std::string::npos)
      << read_text(p.dir / "again.log");
}

TEST(WebDatasetPrepare, MembersCutIntoClipsAsLooseFilesAre) {
  SKIP_WITHOUT_DECODING();
  PreparedCache p;
  const std::string stage = p.dir / "stage", shards = p.dir / "shards";
  fs::create_directories(stage);
  fs::create_directories(shards);
  for (const std::string f : {"land.mp4", "port.mp4"}) {
    fs::copy_file(p.dir / ("videos/" + f), stage + "/" + f);
    std::ofstream(stage + "/" + f.substr(0, f.find('.')) + ".txt") << p.caption_of.at(f) << "\n";
  }
  ASSERT_EQ(run("tar -cf " + shards + "/s0.tar -C " + stage + " land.mp4 land.txt port.mp4 port.txt"), 0);
  // 12 frames at 8 fps cut into clips of 0.625 s (5 frames) every 0.5 s.
  const std::string cut = " --set data.clip_seconds=0.625 --set data.clip_stride_seconds=0.5";
  const std::string loose_sets = " --set 'data.manifest=\"" + stage + "\"'" + cut;
  const std::string tar_sets = " --set 'data.manifest=\"" + shards + "/s0.tar\"' --set 'data.cache_dir=\"" +
                               (p.dir / "cache_tar") + "\"'" + cut;
  ASSERT_EQ(run(p.vidit("prepare" + loose_sets) + " > " + (p.dir / "loose.log") + " 2>&1"), 0) << read_text(p.dir / "loose.log");
  ASSERT_EQ(run(p.vidit("prepare" + tar_sets) + " > " + (p.dir / "tar.log") + " 2>&1"), 0) << read_text(p.dir / "tar.log");
  const LatentCache loose(p.dir / "cache"), packed(p.dir / "cache_tar");
  ASSERT_GT(loose.size(), 2) << "each video should give several clips";
  ASSERT_EQ(packed.size(), loose.size());
  std::map<std::string, at::Tensor> by_clip;  // caption and window -> latents
  auto clip = [](const CacheIndexEntry& e) {
    return e.meta.at("caption").get<std::string>() + " " + e.meta.at("start").dump() + " " + e.meta.at("end").dump();
  };
  for (int64_t i = 0; i < loose.size(); ++i) by_clip[clip(loose.entry(i))] = loose.load(i).mean.clone();
  for (int64_t i = 0; i < packed.size(); ++i) {
    const std::string c = clip(packed.entry(i));
    ASSERT_TRUE(by_clip.count(c)) << c;
    EXPECT_TRUE(at::equal(packed.load(i).mean, by_clip.at(c))) << c;
  }
}

}  // namespace
}  // namespace vidit
