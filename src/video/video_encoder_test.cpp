// encode_video_mp4 (video_encoder.cpp) read back with the project's own decode_video: frame count,
// size and pixels survive (PSNR bounds measured on these patterns, with margin), the upscale is
// nearest-neighbour, the file is tagged and laid out as promised (BT.709 limited range yuv444p
// H.264, index in front), no `ffmpeg` program is needed, and failures leave nothing behind.
// None of these tests runs the ffmpeg CLI.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "video/video_decoder.h"
#include "video/video_test_util.h"

#if defined(VIDIT_HAVE_FFMPEG)
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}
#endif

namespace vidit {
namespace {

namespace fs = std::filesystem;
using video_test::expect_error_naming;

#define SKIP_WITHOUT_FFMPEG_LIBS()                                                     \
  do {                                                                                 \
    if (!::vidit::video_decoding_available())                                          \
      GTEST_SKIP() << "this build has no FFmpeg libraries (encode and decode throw)";  \
  } while (0)

// Smooth colour waves that move with t: [T, H, W, 3] uint8. What generated samples look like
// to an encoder far more than hard-edged test squares do.
at::Tensor smooth_pattern(int64_t T, int64_t H, int64_t W) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor t = at::arange(T, f64).view({T, 1, 1}).expand({T, H, W});
  const at::Tensor y = at::arange(H, f64).view({1, H, 1}).expand({T, H, W});
  const at::Tensor x = at::arange(W, f64).view({1, 1, W}).expand({T, H, W});
  const double two_pi = 2 * M_PI;
  const at::Tensor r = 127.5 + 100 * at::sin(two_pi * (x / double(W) + t / 8.0));
  const at::Tensor g = 127.5 + 100 * at::cos(two_pi * y / double(H) + 0.5 * t);
  const at::Tensor b = 40 + 170 * (x + y) / double(std::max<int64_t>(W + H - 2, 1));
  return at::stack({r, g, b}, -1).round().clamp(0, 255).to(at::kByte).contiguous();
}

// Peak signal-to-noise ratio of `got` against `want` in dB (infinite when equal).
double psnr(const at::Tensor& got, const at::Tensor& want) {
  const double mse = (got.to(at::kDouble) - want.to(at::kDouble)).pow(2).mean().item<double>();
  return mse == 0 ? std::numeric_limits<double>::infinity() : 10 * std::log10(255.0 * 255.0 / mse);
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The top-level boxes of an MP4 file, in order ("ftyp", "moov", "mdat", ...).
std::vector<std::string> top_level_boxes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
  std::vector<std::string> boxes;
  uint64_t at = 0;
  while (at + 8 <= bytes.size()) {
    uint64_t size = 0;
    for (int i = 0; i < 4; ++i) size = size << 8 | bytes[at + i];
    boxes.emplace_back(reinterpret_cast<const char*>(&bytes[at + 4]), 4);
    if (size == 1 && at + 16 <= bytes.size()) {  // 64-bit size follows the type
      size = 0;
      for (int i = 8; i < 16; ++i) size = size << 8 | bytes[at + i];
    } else if (size == 0) {  // runs to the end of the file
      size = bytes.size() - at;
    }
    if (size < 8) break;  // malformed: stop rather than loop
    at += size;
  }
  return boxes;
}

// Sets PATH for the lifetime of the object and restores it (or its absence) afterwards, also
// when the test fails with an exception.
class ScopedPath {
 public:
  explicit ScopedPath(const std::string& value) {
    if (const char* old = std::getenv("PATH")) saved_ = old;
    setenv("PATH", value.c_str(), 1);
  }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;
  ~ScopedPath() {
    if (saved_) setenv("PATH", saved_->c_str(), 1);
    else unsetenv("PATH");
  }

 private:
  std::optional<std::string> saved_;
};

// True when a new file can be created in `dir` (root can write into a folder whose mode
// forbids it, so the mode alone does not say).
bool can_create_in(const fs::path& dir) {
  const fs::path probe = dir / ".vidit_write_probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

class VideoEncoder : public ::testing::Test {
 protected:
  test::ScratchDir scratch_{"video_encoder"};
  fs::path dir_{scratch_.path()};
};

TEST_F(VideoEncoder, DecodesBackToTheSameFrames) {
  SKIP_WITHOUT_FFMPEG_LIBS();
  // Measured with libx264 0.164 (Debian 12): 44.5 dB at crf 10, 44.6 dB upscaled, 52 dB at crf 0
  // (the 8-bit YUV round trip's own rounding). The bounds leave ~6 dB for other x264 versions.
  const at::Tensor clip = smooth_pattern(8, 48, 64);
  const fs::path out = dir_ / "clip.mp4";
  encode_video_mp4(out.string(), clip, 8.0, /*crf=*/10);
  const DecodedVideo v = decode_video(out.string());
  ASSERT_EQ(v.frames.sizes(), clip.sizes());
  EXPECT_EQ(v.width, 64);
  EXPECT_EQ(v.height, 48);
  EXPECT_DOUBLE_EQ(v.fps, 8.0);
  EXPECT_GT(psnr(v.frames, clip), 38.0);

  // Upscale 2: twice the size, each pixel a 2x2 block. Overwrites the file, from a
  // non-contiguous view.
  const at::Tensor channels_first = clip.permute({0, 3, 1, 2}).contiguous();
  encode_video_mp4(out.string(), channels_first.permute({0, 2, 3, 1}), 8.0, 10, /*upscale=*/2);
  const DecodedVideo big = decode_video(out.string());
  ASSERT_EQ(big.frames.sizes(), (at::IntArrayRef{8, 96, 128, 3}));
  EXPECT_EQ(big.width, 128);
  EXPECT_EQ(big.height, 96);
  EXPECT_GT(psnr(big.frames, clip.repeat_interleave(2, 1).repeat_interleave(2, 2)), 38.0);

  // Odd sizes, a fractional frame rate, lossless mode.
  const at::Tensor odd = smooth_pattern(5, 17, 33);
  const fs::path odd_out = dir_ / "odd.mp4";
  encode_video_mp4(odd_out.string(), odd, 30000.0 / 1001.0, /*crf=*/0);
  const DecodedVideo o = decode_video(odd_out.string());
  ASSERT_EQ(o.frames.sizes(), odd.sizes());
  EXPECT_NEAR(o.fps, 30000.0 / 1001.0, 1e-6);
  EXPECT_GT(psnr(o.frames, odd), 45.0);

  // Only the finished files: no temporary left over.
  EXPECT_EQ(names_in(dir_), (std::set<std::string>{"clip.mp4", "odd.mp4"}));
}

TEST_F(VideoEncoder, WritesTaggedYuv444WithTheIndexInFront) {
  SKIP_WITHOUT_FFMPEG_LIBS();
  const fs::path out = dir_ / "tags.mp4";
  encode_video_mp4(out.string(), smooth_pattern(4, 16, 24), 12.0, 12);

  // faststart: the index (moov) precedes the media data (mdat).
  const std::vector<std::string> boxes = top_level_boxes(out);
  std::ptrdiff_t moov = -1, mdat = -1;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i] == "moov" && moov < 0) moov = std::ptrdiff_t(i);
    if (boxes[i] == "mdat" && mdat < 0) mdat = std::ptrdiff_t(i);
  }
  ASSERT_GE(moov, 0) << "no moov box";
  ASSERT_GE(mdat, 0) << "no mdat box";
  EXPECT_LT(moov, mdat) << "the index is not in front (faststart)";

#if defined(VIDIT_HAVE_FFMPEG)
  // The stream says what it is: H.264 yuv444p, BT.709 matrix, primaries and transfer, tv range.
  AVFormatContext* fmt = nullptr;
  ASSERT_GE(avformat_open_input(&fmt, out.c_str(), nullptr, nullptr), 0);
  ASSERT_GE(avformat_find_stream_info(fmt, nullptr), 0);
  const int index = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  ASSERT_GE(index, 0);
  const AVCodecParameters* par = fmt->streams[index]->codecpar;
  EXPECT_EQ(par->codec_id, AV_CODEC_ID_H264);
  EXPECT_EQ(par->format, AV_PIX_FMT_YUV444P);
  EXPECT_EQ(par->width, 24);
  EXPECT_EQ(par->height, 16);
  EXPECT_EQ(par->color_range, AVCOL_RANGE_MPEG);
  EXPECT_EQ(par->color_space, AVCOL_SPC_BT709);
  EXPECT_EQ(par->color_primaries, AVCOL_PRI_BT709);
  EXPECT_EQ(par->color_trc, AVCOL_TRC_BT709);
  avformat_close_input(&fmt);
#endif
}

TEST_F(VideoEncoder, NeedsNoFfmpegProgram) {
  SKIP_WITHOUT_FFMPEG_LIBS();
  const fs::path bin = dir_ / "empty_bin";
  fs::create_directories(bin);
  const fs::path videos = dir_ / "videos";
  fs::create_directories(videos);
  const fs::path out = videos / "clip.mp4";
  const at::Tensor clip = smooth_pattern(6, 32, 32);
  {
    ScopedPath no_programs(bin.string());
    ASSERT_NE(std::system("command -v ffmpeg >/dev/null 2>&1"), 0) << "ffmpeg is still reachable";
    encode_video_mp4(out.string(), clip, 8.0, 10);
  }
  const DecodedVideo v = decode_video(out.string());
  ASSERT_EQ(v.frames.sizes(), clip.sizes());
  EXPECT_GT(psnr(v.frames, clip), 38.0);
  EXPECT_EQ(names_in(videos), (std::set<std::string>{"clip.mp4"}));
}

TEST_F(VideoEncoder, UnwritableFolderIsAnErrorNamingThePathAndLeavesNothing) {
  // Runs in every build: without FFmpeg the stub's error must name the path too.
  const at::Tensor clip = smooth_pattern(2, 8, 8);
  const fs::path locked = dir_ / "locked";
  fs::create_directories(locked);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read |
                              fs::perms::others_exec);
  // As root the mode does not stop writes (and these tests run as root on the dev machines):
  // then use a folder the kernel refuses to create files in.
  fs::path folder = locked;
  if (can_create_in(locked)) {
    std::error_code ec;
    if (fs::is_directory("/sys", ec) && !can_create_in("/sys")) {
      folder = "/sys";
    } else {
      fs::permissions(locked, fs::perms::owner_all);
      GTEST_SKIP() << "no unwritable folder to test with (running as root, and /sys is writable)";
    }
  }
  const std::set<std::string> before = names_in(folder);
  const fs::path out = folder / "vidit_encoder_test_clip.mp4";
  const std::string msg = expect_error_naming(out.string(), [&] {
    encode_video_mp4(out.string(), clip, 8.0, 10);
  });
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(names_in(folder), before) << "something was left behind in " << folder;
  if (video_decoding_available()) {
    EXPECT_NE(msg.find("writable"), std::string::npos) << msg;
  }
  fs::permissions(locked, fs::perms::owner_all);  // so that the scratch folder can go
}

TEST_F(VideoEncoder, OutputPathThatIsAFolderIsAnErrorAndLeavesNothing) {
  const fs::path taken = dir_ / "taken.mp4";
  fs::create_directories(taken);
  expect_error_naming(taken.string(), [&] {
    encode_video_mp4(taken.string(), smooth_pattern(2, 8, 8), 8.0, 10);
  });
  EXPECT_TRUE(fs::is_directory(taken));
  EXPECT_EQ(names_in(dir_), (std::set<std::string>{"taken.mp4"}));
}

TEST_F(VideoEncoder, WithoutFfmpegLibrariesTheErrorNamesThePackages) {
  if (video_decoding_available()) GTEST_SKIP() << "this build has FFmpeg";
  const std::string out = (dir_ / "clip.mp4").string();
  const std::string msg = expect_error_naming(out, [&] {
    encode_video_mp4(out, smooth_pattern(2, 8, 8), 8.0, 10);
  });
  EXPECT_NE(msg.find("libavcodec-dev"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace vidit
