// `vidit prepare` cutting long videos into clips (data.clip_seconds, data.split_scenes), on real
// videos made by the ffmpeg CLI: a 24 s video of three solid-colour scenes joined by hard cuts, a
// moving pattern with no cut, videos shorter than a clip (one long enough for a bucket, one not),
// and a strobe. Checks the clip count, the time ranges in the index, that no clip crosses a cut,
// that each clip's latents hold its scene's colour, the summary, and that a rerun decodes nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/latent_cache.h"
#include "prepare/demo_codec.h"
#include "prepare/frame_encoder.h"
#include "prepare/prepare.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using video_test::ffmpeg;

TEST(PrepareClips, LongVideosAreCutIntoClipsThatCrossNoSceneCut) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir{"prepare_clips"};
  const std::string v = dir / "videos";
  fs::create_directories(v);
  const std::string x264 = " -pix_fmt yuv420p -c:v libx264 ";
  // Red 0-6 s, green 6-14 s, blue 14-24 s.
  ASSERT_TRUE(ffmpeg("-f lavfi -i color=c=red:s=64x48:r=8:d=6 -f lavfi -i color=c=lime:s=64x48:r=8:d=8 "
                     "-f lavfi -i color=c=blue:s=64x48:r=8:d=10 -filter_complex '[0][1][2]concat=n=3:v=1'" + x264 +
                     v + "/scenes.mp4"));
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=s=64x48:r=8:d=5" + x264 + v + "/plain.mp4"));
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=s=64x48:r=8:d=1" + x264 + v + "/short.mp4"));  // 8 frames: one 5-frame clip
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=s=64x48:r=8:d=0.5" + x264 + v + "/tiny.mp4"));  // 4 frames: no bucket
  ASSERT_TRUE(ffmpeg("-f lavfi -i color=c=black:s=64x48:r=8:d=4 -vf \"geq=lum='if(mod(N,2),235,16)':cb=128:cr=128\"" +
                     x264 + v + "/strobe.mp4"));
  {
    std::ofstream m(dir / "manifest.jsonl");
    for (std::string f : {"scenes.mp4", "plain.mp4", "short.mp4", "tiny.mp4", "strobe.mp4"})
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", "video " + f}}.dump() << "\n";
  }
  const std::string config = dir / "prepare.toml";
  std::ofstream(config) << "[model]\nin_channels = 12\nout_channels = 12\npatch = [1, 2, 2]\n"
                        << "[data]\nsource = \"cache\"\nmanifest = \"" << (dir / "manifest.jsonl") << "\"\n"
                        << "cache_dir = \"" << (dir / "cache") << "\"\ncodec = \"demo\"\nshard_mb = 1\n"
                        << "cache_dtype = \"fp32\"\ndecode_threads = 1\ndecoder = \"cpu\"\n"
                        << "clip_seconds = 2.0\nsplit_scenes = true\n"
                        << "[buckets]\nresolutions = [48]\naspect_ratios = [1.3333333]\n"
                        << "frames = [5, 9]\nframe_stride = 4\nmultiple = 8\n";
  const Config cfg = load_config(config);
  const PrepareReport r = prepare_cache(cfg, make_frame_encoder(cfg), make_caption_encoder(cfg));
  // scenes: 3 red + 4 green + 5 blue; plain: 2; short: 1 (whole); strobe: 1; tiny: rejected.
  EXPECT_EQ(r.written, 16);
  EXPECT_EQ(r.videos_cut, 4);
  EXPECT_EQ(r.rejected_by, (std::map<std::string, int64_t>{{"bucket", 1}}));
  EXPECT_EQ(r.warned_by, (std::map<std::string, int64_t>{{"scenes", 1}}));
  EXPECT_TRUE(r.merged);
  const std::string table = prepare_summary(r, "summary");
  EXPECT_NE(table.find("16 from 4 videos"), std::string::npos) << table;
  EXPECT_NE(table.find("warnings: scenes"), std::string::npos) << table;
  {
    std::ifstream in(cfg.data.cache_dir + "/rejects.jsonl");
    const nlohmann::json reject = nlohmann::json::parse(in);
    EXPECT_NE(reject["input"].get<std::string>().find("tiny.mp4"), std::string::npos) << reject;
    EXPECT_NE(reject["where"].get<std::string>().find("clip [0.000, 0.500) s"), std::string::npos) << reject;
    EXPECT_NE(reject["reason"].get<std::string>().find("too short"), std::string::npos) << reject;
  }

  LatentCache cache(cfg.data.cache_dir);
  ASSERT_EQ(cache.size(), 16);
  std::map<std::string, std::vector<std::pair<double, double>>> ranges;
  const std::vector<double> cuts{6, 14};
  for (int64_t i = 0; i < cache.size(); ++i) {
    const CacheIndexEntry& e = cache.entry(i);
    const std::string source = fs::path(e.meta["source"].get<std::string>()).filename().string();
    const double a = e.meta["start"].get<double>(), b = e.meta["end"].get<double>();
    ranges[source].emplace_back(a, b);
    EXPECT_EQ(e.key, cache_key(e.meta["source"].get<std::string>(), a, b));
    if (source != "scenes.mp4") continue;
    EXPECT_DOUBLE_EQ(b - a, 2);
    for (double c : cuts) EXPECT_FALSE(c > a && c < b) << "clip [" << a << ", " << b << ") crosses the cut at " << c;
    EXPECT_EQ(e.bucket, "9x40x56");
    // The latents decode to the scene's colour: red, green or blue dominant in every frame.
    const at::Tensor frames = demo::codec_decode(cache.load(i).mean, 2).to(at::kFloat);  // [T, H, W, 3]
    const at::Tensor rgb = frames.mean(at::IntArrayRef{0, 1, 2});
    const int64_t want = a < 6 ? 0 : a < 14 ? 1 : 2;
    EXPECT_EQ(rgb.argmax().item<int64_t>(), want) << "clip [" << a << ", " << b << ") has mean colour " << rgb;
    EXPECT_GT(rgb[want].item<float>(), 100.f);
  }
  std::sort(ranges["scenes.mp4"].begin(), ranges["scenes.mp4"].end());
  const std::vector<std::pair<double, double>> want{{0, 2},   {2, 4},   {4, 6},   {6, 8},   {8, 10},  {10, 12},
                                                    {12, 14}, {14, 16}, {16, 18}, {18, 20}, {20, 22}, {22, 24}};
  EXPECT_EQ(ranges["scenes.mp4"], want);
  std::sort(ranges["plain.mp4"].begin(), ranges["plain.mp4"].end());
  EXPECT_EQ(ranges["plain.mp4"], (std::vector<std::pair<double, double>>{{0, 2}, {2, 4}}));
  ASSERT_EQ(ranges["short.mp4"].size(), 1u);
  EXPECT_NEAR(ranges["short.mp4"][0].second, 1, 1e-6) << "the whole 1 s video";
  EXPECT_EQ(ranges["strobe.mp4"].size(), 1u);

  // A rerun finds every clip cached and decodes only the video that gave none (tiny.mp4).
  const PrepareReport again = prepare_cache(cfg, make_frame_encoder(cfg), make_caption_encoder(cfg));
  EXPECT_EQ(again.written, 0);
  EXPECT_EQ(again.already_done, 16);
  EXPECT_EQ(again.videos_cut, 4);
  EXPECT_EQ(again.rejected, 1);
  EXPECT_EQ(LatentCache(cfg.data.cache_dir).size(), 16);
}

TEST(PrepareClips, SplitScenesWithoutAClipLengthIsAClearError) {
  test::ScratchDir dir{"prepare_clips"};
  std::ofstream(dir / "m.jsonl") << "";
  Config cfg;
  cfg.data.manifest = dir / "m.jsonl";
  cfg.data.cache_dir = dir / "cache";
  cfg.data.split_scenes = true;
  try {
    prepare_cache(cfg, make_frame_encoder(cfg), make_caption_encoder(cfg));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.clip_seconds"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vidit
