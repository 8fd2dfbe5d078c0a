// `vidit prepare` end to end on real files made by the ffmpeg CLI: two worker processes share a
// manifest with good clips in several shapes and every kind of unusable input; the cache holds
// the good ones in their buckets, rejects.jsonl names each bad one with its reason, a rerun skips
// everything, --verify catches a damaged shard, and the loader and `vidit train` read the cache.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/cache_loader.h"
#include "loader/latent_cache.h"
#include "video/video_test_util.h"
#include "../../tests/mpi_test_util.h"
#include "checkpoint/checkpoint.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using video_test::ffmpeg;

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

struct PreparedCache {
  test::ScratchDir dir{"prepare"};
  std::string config;
  std::map<std::string, std::string> caption_of;  // file name -> caption
  std::vector<std::string> bad;                    // file names expected in rejects

  PreparedCache() {
    const std::string v = dir / "videos";
    fs::create_directories(v);
    // Good clips: landscape 4:3, portrait 3:4, wide 16:9 (VP9 in WebM), 12 frames each at 8 fps.
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/land.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=48x64:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/port.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=96x54:rate=8 -frames:v 12 -c:v libvpx-vp9 -b:v 200k " + v + "/wide.webm");
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/land2.mp4");
    // Unusable: too short (3 frames), too small (16x12), truncated, random bytes, empty,
    // audio only, and a file that does not exist.
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 3 -pix_fmt yuv420p -c:v libx264 " + v + "/short.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=16x12:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/tiny.mp4");
    {
      std::ifstream in(v + "/land.mp4", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(v + "/truncated.mp4", std::ios::binary) << bytes.substr(0, 300);
      std::string noise(5000, '\0');
      for (size_t i = 0; i < noise.size(); ++i) noise[i] = char((i * 2654435761u) >> 13);
      std::ofstream(v + "/random.mp4", std::ios::binary) << noise;
      std::ofstream(v + "/empty.mp4");
    }
    ffmpeg("-f lavfi -i sine=frequency=440:duration=1 -c:a aac " + v + "/audio.m4a");
    std::ofstream m(dir / "manifest.jsonl");
    for (std::string f : {"land.mp4", "port.mp4", "wide.webm", "land2.mp4"}) {
      caption_of[f] = "clip " + f.substr(0, f.find('.'));
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", caption_of[f]}}.dump() << "\n";
    }
    for (std::string f : {"short.mp4", "tiny.mp4", "truncated.mp4", "random.mp4", "empty.mp4", "audio.m4a", "missing.mp4"}) {
      bad.push_back(f);
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", "bad"}}.dump() << "\n";
    }
    m << "{broken json\n";
    config = dir / "prepare.toml";
    std::ofstream(config) << "[model]\nin_channels = 12\nout_channels = 12\npatch = [1, 2, 2]\n"
                          << "[data]\nsource = \"cache\"\nmanifest = \"" << (dir / "manifest.jsonl") << "\"\n"
                          << "cache_dir = \"" << (dir / "cache") << "\"\ncodec = \"demo\"\nshard_mb = 1\n"
                          << "cache_dtype = \"fp32\"\ndecode_threads = 1\nloader_threads = 2\n"
                          << "[buckets]\nresolutions = [48]\naspect_ratios = [1.3333333, 0.75, 1.7777778]\n"
                          << "frames = [5, 9]\nframe_stride = 4\nmultiple = 8\n"
                          << "[train]\nbatch_size = 2\nsteps = 3\nthreads = 1\nlog_every = 1\nout_dir = \""
                          << (dir / "run") << "\"\n";
  }
  std::string vidit(const std::string& args) const {
    return std::string(VIDIT_BINARY) + " " + args + " --config " + config;
  }
};

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

// Two ranks training on the cache (each with batches of its own and a random stream of its
// own, for the latents' reparameterisation and the noise): stopped after 3 steps and resumed,
// the run ends with the weights of the uninterrupted one, bit for bit. Every rank's stream is in
// the checkpoint; were rank 1 resumed with rank 0's, its noise would differ.
TEST(Prepare, TwoRanksResumeTrainingOnTheCacheExactly) {
  SKIP_WITHOUT_DECODING();
  VIDIT_REQUIRE_MPI();
  PreparedCache p;
  ASSERT_EQ(run(p.vidit("prepare") + " > /dev/null 2>&1"), 0);
  const std::string sets = " --set parallel.replicate=2 train.steps=6 train.warmup_steps=1 train.out_dir=";
  const std::string whole = p.dir / "whole", parts = p.dir / "parts";
  auto a = test::mpirun(2, p.vidit("train") + sets + whole);
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = test::mpirun(2, p.vidit("train --max-steps 3") + sets + parts);
  ASSERT_EQ(b.status, 0) << b.output;
  auto c = test::mpirun(2, p.vidit("train --resume") + sets + parts);
  ASSERT_EQ(c.status, 0) << c.output;
  const CheckpointState x = load_checkpoint(*latest_checkpoint(whole)), y = load_checkpoint(*latest_checkpoint(parts));
  EXPECT_EQ(x.step, 6);
  EXPECT_EQ(y.step, 6);
  EXPECT_EQ(y.optimizer.count("rng/train.dp1"), 1u);
  for (const auto& [name, t] : x.model) EXPECT_TRUE(at::equal(t, y.model.at(name))) << name;
}

}  // namespace
}  // namespace vidit
