// A data loader decodes millions of short clips in one process: decode_video must not leak.
// 1,000 decodes of a tiny clip (32x32, 5 frames), cycling through every path (native, seek,
// resampling, square pixels, frame limit, auto device, a failing truncated file), must leave the
// resident set within kGrowthBoundMb of where it stood after a warm-up. (A leaked format or codec
// context costs tens to hundreds of KB per call, i.e. tens of MB over this loop.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "video/video_decoder.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

using namespace video_test;  // NOLINT: the shared ffmpeg CLI helpers

constexpr double kGrowthBoundMb = 16;

// VmRSS of this process in MB, from /proc/self/status.
double resident_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return -1;
}

TEST(VideoDecodeMemory, ThousandClipsKeepTheResidentSetFlat) {
  SKIP_WITHOUT_DECODING();
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / ("vidit_video_decode_memory_test_" +
                                                    std::to_string(::getpid()) + "_" +
                                                    std::to_string(rd()));
  fs::create_directories(dir);
  const fs::path clip = dir / "tiny.mp4";
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=32x32:rate=10 -frames:v 5 -c:v libx264 "
                     "-pix_fmt yuv420p -g 2 -vf setsar=3/2 " + quote(clip)));
  const fs::path cut = dir / "cut.mp4";
  {
    std::ifstream in(clip, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }

  const auto decode_one = [&](int i) {
    DecodeOptions o;  // device = auto: the fallback path on a machine without NVDEC
    o.threads = 1 + i % 2;
    switch (i % 50 == 5 ? 5 : i % 5) {
      case 0: break;
      case 1: o.start_seconds = 0.25; break;  // seek
      case 2: o.target_fps = 7; break;
      case 3: o.square_pixels = true; break;
      case 4: o.max_frames = 2; o.start_seconds = 0.1; o.end_seconds = 0.4; break;
      case 5:  // one in 50: a truncated file, to exercise the error path's cleanup
        try {
          decode_video(cut.string(), o);
          ADD_FAILURE() << "no error for " << cut;
        } catch (const Error&) {
        }
        return;
    }
    const DecodedVideo v = decode_video(clip.string(), o);
    ASSERT_GE(v.frames.size(0), 1);
  };

  for (int i = 0; i < 100; ++i) decode_one(i);  // warm-up: allocator pools, codec tables
  const double before = resident_mb();
  for (int i = 0; i < 1000; ++i) decode_one(i);
  const double after = resident_mb();
  ASSERT_GT(before, 0);
  RecordProperty("rss_growth_mb", std::to_string(after - before));
  std::printf("[ info ] resident set %.1f MB -> %.1f MB over 1000 decodes (bound +%.0f MB)\n",
              before, after, kGrowthBoundMb);
  EXPECT_LT(after - before, kGrowthBoundMb);

  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace vidit
