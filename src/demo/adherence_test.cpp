#include "demo/adherence.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "video/video_decoder.h"
#include "video/video_test_util.h"
#include "prepare/caption_embedder.h"
#include "prepare/demo_codec.h"
#include "demo/demo_data.h"
#include "demo/shapes.h"

namespace vidit::demo {
namespace {

using test::ScratchDir;

// Renders a clip, encodes it to H.264 MP4 with FFmpeg and decodes it back: a real video file.
at::Tensor through_mp4(const ClipSpec& spec, const ScratchDir& dir, const std::string& name) {
  encode_video_mp4(dir / name, render_clip(spec), 8.0, 10);
  return decode_video(dir / name).frames;
}

TEST(DemoAdherence, ScoresRealMovingShapeVideos) {
  if (!video_decoding_available()) GTEST_SKIP() << "built without FFmpeg";
  ScratchDir dir("adh");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  int n = 0;
  for (int64_t size : {16, 32})
  for (int colour = 0; colour < 4; ++colour)
    for (Direction d : directions()) {
      ClipSpec spec = random_clip(colour, (colour + n) % 2, d, size, size, 8, size, gen);
      at::Tensor frames = through_mp4(spec, dir, "c" + std::to_string(n++) + ".mp4");
      ClipAnalysis a = analyse_clip(frames);
      EXPECT_TRUE(adheres(a, colour, d)) << caption(spec) << " analysed as " << a.describe();
      // Scored against another prompt it fails.
      EXPECT_FALSE(adheres(a, (colour + 1) % 4, d)) << caption(spec);
      Direction wrong = d == Direction::Left ? Direction::Right : Direction::Left;
      EXPECT_FALSE(adheres(a, colour, wrong)) << caption(spec);
    }
}

TEST(DemoAdherence, StaticBlankAndNoiseVideosFail) {
  if (!video_decoding_available()) GTEST_SKIP() << "built without FFmpeg";
  ScratchDir dir("adh_static");
  ClipSpec still;
  still.colour = 2, still.speed = 0;  // a blue square that does not move
  ClipAnalysis a = analyse_clip(through_mp4(still, dir, "still.mp4"));
  EXPECT_TRUE(a.object_found);
  EXPECT_EQ(a.colour, 2);
  EXPECT_FALSE(a.moving) << a.describe();
  for (Direction d : directions()) EXPECT_FALSE(adheres(a, 2, d));
  // Nothing on screen.
  EXPECT_FALSE(analyse_clip(at::zeros({8, 32, 32, 3}, at::kByte)).object_found);
  // Random noise (what an untrained model produces) is not a moving object.
  at::Tensor noise = at::randint(0, 256, {8, 32, 32, 3}, at::kLong).to(at::kByte);
  ClipAnalysis n = analyse_clip(noise);
  bool any = false;
  for (int c = 0; c < 4; ++c)
    for (Direction d : directions()) any |= adheres(n, c, d);
  EXPECT_FALSE(any) << n.describe();
}

TEST(DemoCodec, SpaceToDepthRoundTripIsLossless) {
  at::Tensor frames = at::randint(0, 256, {3, 16, 24, 3}, at::kLong).to(at::kByte);
  at::Tensor lat = codec_encode(frames, 4);
  EXPECT_EQ(lat.sizes(), (std::vector<int64_t>{48, 3, 4, 6}));
  EXPECT_LE(lat.max().item<float>(), 1.0f);
  EXPECT_GE(lat.min().item<float>(), -1.0f);
  EXPECT_TRUE(at::equal(codec_decode(lat, 4), frames));
  // A pixel's channels land in one latent position: block (0,0) of frame 0 holds pixel (1,2).
  at::Tensor one = at::zeros({1, 4, 4, 3}, at::kByte);
  one[0][1][2][0] = 255;
  at::Tensor l1 = codec_encode(one, 4);
  EXPECT_EQ((l1 > -1).sum().item<int64_t>(), 1);
}

TEST(DemoData, CaptionsEmbedPerWord) {
  at::Tensor a = embed_caption("a red square moving left", 8, 16);
  at::Tensor b = embed_caption("a blue square moving left", 8, 16);
  EXPECT_TRUE(at::equal(a[0], b[0]));       // "a"
  EXPECT_FALSE(at::equal(a[1], b[1]));      // "red" vs "blue"
  EXPECT_TRUE(at::equal(a[4], b[4]));       // "left"
  EXPECT_EQ(a[5].abs().sum().item<float>(), 0.0f);  // padding
  EXPECT_THROW(embed_caption("one two three", 2, 4), Error);
}

// The demo's own videos go through prepare (decode, buckets, cache) and the bucketed loader:
// square clips land in 6x16x16, the 5:4 and 3:2 clips in 6x16x20, and batches of both come out.
TEST(DemoData, VideosAreCachedIntoTwoBucketsAndLoaded) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir("demo_data");
  Config cfg = parse_config("", "<test>", {"demo.videos=12", "data.loader_threads=1"});
  DemoData d = prepare_demo_data(cfg, dir.path());
  EXPECT_EQ(d.report.written, 12);
  EXPECT_EQ(d.report.rejected, 0);
  EXPECT_EQ(d.report.per_bucket, (std::map<std::string, int64_t>{{"6x16x16", 4}, {"6x16x20", 8}}));
  std::set<std::vector<int64_t>> shapes;
  for (int i = 0; i < 8; ++i) {
    MicroBatch b = d.loader->next();
    ASSERT_GT(b.latents.size(0), 0);
    shapes.insert(b.latents.sizes().slice(1).vec());
    EXPECT_EQ(b.texts.sizes(), (std::vector<int64_t>{b.latents.size(0), cfg.model.text_len, cfg.model.text_dim}));
  }
  EXPECT_EQ(shapes, (std::set<std::vector<int64_t>>{{12, 6, 8, 8}, {12, 6, 8, 10}}));
  // Buckets without the square shape the demo samples at are refused, naming the section.
  Config bad = parse_config("", "<test>", {"buckets.resolutions=[18]", "demo.videos=3"});  // 20x20, 16x20
  try {
    prepare_demo_data(bad, dir / "bad");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[buckets] has no 6x16x16 bucket"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vidit::demo
