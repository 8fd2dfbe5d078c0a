// A cache follows its captions (issue: a cache never serves what its inputs no longer say): real
// videos made by ffmpeg, prepared; the manifest's caption of one changed; the rerun gives that
// clip its new text without decoding or encoding its video (the frame encoder is not called),
// keeps its latents byte for byte, and leaves one entry per clip in the index; with clips cut
// from a video (data.clip_seconds) every clip of a re-captioned video is re-embedded the same way.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/latent_cache.h"
#include "prepare/frame_encoder.h"
#include "prepare/prepare.h"
#include "../../tests/mpi_test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using video_test::ffmpeg;

struct Recaptioned {
  test::ScratchDir dir{"recaption"};
  Config cfg;

  explicit Recaptioned(double clip_seconds = 0) {
    const std::string v = dir / "videos";
    fs::create_directories(v);
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 24 -pix_fmt yuv420p -c:v libx264 " + v + "/land.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=48x64:rate=8 -frames:v 24 -pix_fmt yuv420p -c:v libx264 " + v + "/port.mp4");
    write_manifest("a grey test card", "a tall test card");
    sets = {"model.in_channels=12", "model.out_channels=12", "model.patch=[1,2,2]", "data.source=\"cache\"",
                           "data.manifest=\"" + (dir / "manifest.jsonl") + "\"", "data.cache_dir=\"" + (dir / "cache") + "\"",
                           "data.codec=\"demo\"", "data.cache_dtype=\"fp32\"", "data.decode_threads=1",
                           "data.clip_seconds=" + std::to_string(clip_seconds), "buckets.resolutions=[48]",
                           "buckets.aspect_ratios=[1.3333333, 0.75]", "buckets.frames=[5, 9]",
                           "buckets.frame_stride=4", "buckets.multiple=8"};
    cfg = load_config("", sets);
  }
  // `vidit prepare ARGS` on this cache; returns the exit status, the output in *out.
  int vidit_prepare(const std::string& args, std::string* out) const {
    std::string cmd = std::string(VIDIT_BINARY) + " prepare " + args;
    for (const auto& s : sets) cmd += " --set '" + s + "'";
    auto r = test::run_process(cmd);
    *out = r.output;
    return r.status;
  }
  std::vector<std::string> sets;
  void write_manifest(const std::string& land, const std::string& port) const {
    std::ofstream m(dir / "manifest.jsonl");
    m << nlohmann::json{{"path", "videos/land.mp4"}, {"caption", land}}.dump() << "\n"
      << nlohmann::json{{"path", "videos/port.mp4"}, {"caption", port}}.dump() << "\n";
  }
  // prepare_cache with the run's encoders, counting the frame encoder's calls.
  PrepareReport prepare(int* encodes) const {
    const FrameEncoder encode = make_frame_encoder(cfg);
    return prepare_cache(cfg, [&](const at::Tensor& f, const ClipRef& clip) { ++*encodes; return encode(f, clip); }, make_caption_encoder(cfg));
  }
  // Every entry of the cache by caption: its latents and text.
  std::map<std::string, std::vector<LatentCache::Loaded>> by_caption() const {
    LatentCache cache(dir / "cache");
    std::map<std::string, std::vector<LatentCache::Loaded>> out;
    for (int64_t i = 0; i < cache.size(); ++i) {
      auto l = cache.load(i);
      out[cache.entry(i).meta["caption"].get<std::string>()].push_back({l.mean.clone(), l.std.clone(), l.text.clone()});
    }
    return out;
  }
};

TEST(CacheFollowsCaptions, ANewCaptionIsEmbeddedWithoutEncodingTheVideoAgain) {
  SKIP_WITHOUT_DECODING();
  Recaptioned r;
  int encodes = 0;
  PrepareReport first = r.prepare(&encodes);
  ASSERT_EQ(first.written, 2) << "rejected " << first.rejected;
  ASSERT_EQ(encodes, 2);
  const auto before = r.by_caption();

  r.write_manifest("a red car drives through the rain", "a tall test card");
  // --verify names the clip whose caption the manifest no longer gives (exit 5), and nothing else.
  std::string out;
  EXPECT_EQ(r.vidit_prepare("--verify", &out), 5) << out;
  EXPECT_NE(out.find("land.mp4 [-1, -1]: caption changed"), std::string::npos) << out;
  EXPECT_EQ(out.find("port.mp4"), std::string::npos) << out;
  EXPECT_NE(out.find("0 failed their checksum, 1 stale, 0 not in the manifest"), std::string::npos) << out;
  encodes = 0;
  PrepareReport again = r.prepare(&encodes);
  EXPECT_EQ(encodes, 0) << "a caption change decoded and encoded a video";
  EXPECT_EQ(again.written, 0);
  EXPECT_EQ(again.reembedded, 1);
  EXPECT_EQ(again.already_done, 1);
  const auto after = r.by_caption();
  ASSERT_EQ(after.size(), 2u) << "one entry per clip";
  ASSERT_TRUE(after.count("a red car drives through the rain"));
  EXPECT_FALSE(after.count("a grey test card")) << "the old caption is still served";
  const auto& car = after.at("a red car drives through the rain")[0];
  const auto& grey = before.at("a grey test card")[0];
  EXPECT_TRUE(at::equal(car.mean, grey.mean)) << "the latents changed";
  EXPECT_TRUE(at::equal(car.std, grey.std));
  EXPECT_TRUE(at::equal(car.text, make_caption_encoder(r.cfg)("a red car drives through the rain").to(car.text.dtype())))
      << "the text is not the new caption's";
  EXPECT_FALSE(at::equal(car.text, grey.text));
  EXPECT_TRUE(at::equal(after.at("a tall test card")[0].text, before.at("a tall test card")[0].text));

  // The index holds each key once, the new one at revision 1; a third run has nothing to do.
  std::ifstream in(r.dir / "cache/index.jsonl");
  std::set<std::string> keys;
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    keys.insert(j["key"].get<std::string>());
    EXPECT_EQ(j.value("rev", 0), j["meta"]["caption"] == "a red car drives through the rain" ? 1 : 0) << line;
  }
  EXPECT_EQ(lines, 2);
  EXPECT_EQ(keys.size(), 2u);
  PrepareReport third = r.prepare(&encodes);
  EXPECT_EQ(third.reembedded, 0);
  EXPECT_EQ(third.already_done, 2);
  EXPECT_TRUE(LatentCache(r.dir / "cache").verify_all().empty());
  EXPECT_EQ(r.vidit_prepare("--verify", &out), 0) << out;
  EXPECT_NE(out.find("0 failed their checksum, 0 stale"), std::string::npos) << out;
}

TEST(CacheFollowsCaptions, EveryClipCutFromAReCaptionedVideoIsReEmbedded) {
  SKIP_WITHOUT_DECODING();
  Recaptioned r(/*clip_seconds=*/1.0);  // 3 s videos: clips of 1 s
  int encodes = 0;
  PrepareReport first = r.prepare(&encodes);
  ASSERT_GT(first.written, 2);
  const int64_t land_clips = int64_t(r.by_caption().at("a grey test card").size());
  r.write_manifest("a grey test card, slowly panning", "a tall test card");
  encodes = 0;
  PrepareReport again = r.prepare(&encodes);
  EXPECT_EQ(encodes, 0);
  EXPECT_EQ(again.reembedded, land_clips);
  EXPECT_EQ(again.already_done, first.written - land_clips);
  const auto after = r.by_caption();
  EXPECT_FALSE(after.count("a grey test card"));
  EXPECT_EQ(int64_t(after.at("a grey test card, slowly panning").size()), land_clips);
}

}  // namespace
}  // namespace vidit
