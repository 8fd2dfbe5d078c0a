// Scene cut detection (scene_cuts.h) on real videos made by the ffmpeg CLI: three solid-colour
// scenes joined with hard cuts, a moving test pattern with none, a fade, and a strobe that the
// detector gives up on.
#include "prepare/scene_cuts.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
using video_test::ffmpeg;

at::Tensor decode_cpu(const std::string& path) {
  DecodeOptions o = video_test::cpu_options();
  o.threads = 1;
  return decode_video(path, o).frames;
}

TEST(SceneCuts, HistogramAndDistance) {
  const auto black = luma_histogram(at::zeros({48, 64, 3}, at::kByte));
  const auto white = luma_histogram(at::full({48, 64, 3}, 255, at::kByte));
  EXPECT_FLOAT_EQ(black[0], 1.f);
  EXPECT_FLOAT_EQ(white[kSceneBins - 1], 1.f);
  EXPECT_DOUBLE_EQ(histogram_distance(black, white), 1.0);
  EXPECT_DOUBLE_EQ(histogram_distance(black, black), 0.0);
  // Half the picture changes: half the mass moves.
  at::Tensor half = at::zeros({48, 64, 3}, at::kByte);
  half.narrow(1, 0, 32).fill_(255);
  EXPECT_NEAR(histogram_distance(black, luma_histogram(half)), 0.5, 1e-6);
  EXPECT_THROW(luma_histogram(at::zeros({48, 64}, at::kByte)), Error);
  EXPECT_THROW(SceneCutDetector(1.5), Error);
}

TEST(SceneCuts, FindsTheHardCutsBetweenThreeScenes) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir{"scene_cuts"};
  const std::string f = dir / "three.mp4";
  ASSERT_TRUE(ffmpeg("-f lavfi -i color=c=red:s=64x48:r=8:d=2 -f lavfi -i color=c=lime:s=64x48:r=8:d=3 "
                     "-f lavfi -i color=c=blue:s=64x48:r=8:d=2 -filter_complex '[0][1][2]concat=n=3:v=1' "
                     "-pix_fmt yuv420p -c:v libx264 " + f));
  const at::Tensor frames = decode_cpu(f);
  ASSERT_EQ(frames.size(0), 56);
  const SceneCuts s = find_scene_cuts(frames, 0.5);
  EXPECT_EQ(s.cuts, (std::vector<int64_t>{16, 40}));
  EXPECT_FALSE(s.dense);
  // A threshold of 1 sees no cut (a distance never exceeds 1).
  EXPECT_TRUE(find_scene_cuts(frames, 1.0).cuts.empty());
}

TEST(SceneCuts, MotionAndFadesAreNoCut) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir{"scene_cuts"};
  const std::string moving = dir / "moving.mp4", fade = dir / "fade.mp4";
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=s=64x48:r=8:d=4 -pix_fmt yuv420p -c:v libx264 " + moving));
  ASSERT_TRUE(ffmpeg("-f lavfi -i color=c=white:s=64x48:r=8:d=16 -vf fade=t=out:st=0:d=16 -pix_fmt yuv420p -c:v libx264 " +
                     fade));
  EXPECT_TRUE(find_scene_cuts(decode_cpu(moving), 0.5).cuts.empty());
  EXPECT_TRUE(find_scene_cuts(decode_cpu(fade), 0.5).cuts.empty());
}

TEST(SceneCuts, AStrobeMakesTheDetectorGiveUp) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir{"scene_cuts"};
  const std::string f = dir / "strobe.mp4";
  // Black and white frames in turn, 4 s at 8 fps.
  ASSERT_TRUE(ffmpeg("-f lavfi -i color=c=black:s=64x48:r=8:d=4 -vf \"geq=lum='if(mod(N,2),235,16)':cb=128:cr=128\" "
                     "-pix_fmt yuv420p -c:v libx264 " + f));
  const at::Tensor frames = decode_cpu(f);
  ASSERT_EQ(frames.size(0), 32);
  const SceneCuts s = find_scene_cuts(frames, 0.5);
  EXPECT_TRUE(s.dense);
  EXPECT_EQ(int64_t(s.cuts.size()), kDenseCutsMin + 1) << "cuts stop once the detector gives up";
}

}  // namespace
}  // namespace vidit
