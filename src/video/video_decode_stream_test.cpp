// decode_video_streaming hands over the same frames, at the same times, as decode_video (native
// rate, resampled, a window that seeks), one at a time; it stops when the sink says so, and an
// error thrown by the sink reaches the caller. probe_video_seconds reads the container's length.
#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
using video_test::ffmpeg;

TEST(VideoDecodeStream, SameFramesAsDecodeVideoOneAtATime) {
  SKIP_WITHOUT_DECODING();
  test::ScratchDir dir{"decode_stream"};
  const std::string f = dir / "pattern.mp4";
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=s=64x48:r=10:d=3 -pix_fmt yuv420p -c:v libx264 -g 8 " + f));
  EXPECT_NEAR(probe_video_seconds(f), 3.0, 1e-6);
  for (const auto& [start, end, fps] : std::vector<std::tuple<double, double, double>>{
           {0, std::numeric_limits<double>::infinity(), 0}, {0, 2, 4}, {1.25, 2.5, 7}}) {
    DecodeOptions o = video_test::cpu_options();
    o.start_seconds = start;
    o.end_seconds = end;
    o.target_fps = fps;
    const DecodedVideo whole = decode_video(f, o);
    std::vector<at::Tensor> frames;
    std::vector<double> times;
    const DecodedVideo streamed = decode_video_streaming(f, o, [&](const at::Tensor& frame, double t) {
      frames.push_back(frame.clone());
      times.push_back(t);
      return true;
    });
    ASSERT_FALSE(frames.empty());
    EXPECT_TRUE(video_test::same_frames(at::stack(frames), whole.frames)) << "window " << start << " fps " << fps;
    EXPECT_EQ(times, whole.timestamps);
    EXPECT_EQ(streamed.timestamps, whole.timestamps);
    EXPECT_FALSE(streamed.frames.defined());
    EXPECT_EQ(streamed.width, 64);
    EXPECT_EQ(streamed.height, 48);
    EXPECT_DOUBLE_EQ(streamed.fps, whole.fps);
  }
  // Stopping: the sink's false ends the decode.
  int n = 0;
  decode_video_streaming(f, video_test::cpu_options(), [&](const at::Tensor&, double) { return ++n < 3; });
  EXPECT_EQ(n, 3);
  // The sink's own error comes through unchanged.
  EXPECT_THROW(decode_video_streaming(f, video_test::cpu_options(),
                                      [&](const at::Tensor&, double) -> bool { throw std::runtime_error("sink"); }),
               std::runtime_error);
  video_test::expect_error_naming(dir / "missing.mp4", [&] {
    decode_video_streaming(dir / "missing.mp4", video_test::cpu_options(), [](const at::Tensor&, double) { return true; });
  });
}

}  // namespace
}  // namespace vidit
