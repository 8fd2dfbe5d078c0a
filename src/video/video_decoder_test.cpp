// decode_video / encode_video_mp4 against real files made by the ffmpeg CLI in a temp dir.
// The reference for decoding is the CLI itself: `ffmpeg -i F -f rawvideo -pix_fmt rgb24 -` uses
// the same libswscale conversion (bicubic flags, the stream's colour matrix and range), so the
// decoded bytes must match exactly.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "video/video_decoder.h"
#include "../../tests/test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

using namespace video_test;  // NOLINT: the shared ffmpeg CLI helpers

// Coloured squares that move with t: [T, H, W, 3] uint8.
at::Tensor square_pattern(int64_t T, int64_t H, int64_t W) {
  static const uint8_t palette[][3] = {{230, 40, 40},  {40, 200, 60},  {50, 70, 220}, {240, 220, 50},
                                       {30, 30, 30},   {240, 240, 240}, {200, 60, 200}, {60, 200, 210}};
  at::Tensor f = at::empty({T, H, W, 3}, at::kByte);
  auto a = f.accessor<uint8_t, 4>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x)
        for (int c = 0; c < 3; ++c) a[t][y][x][c] = palette[(y / 8 + x / 8 + t) % 8][c];
  return f;
}

class VideoDecoder : public ::testing::Test {
 protected:
  fs::path file(const std::string& name) const { return dir_ / name; }

  // 16 frames of lavfi testsrc2, 64x48, H.264 4:2:0 with B-frames (so the decoder holds
  // frames back and the flush at EOF matters).
  fs::path make_h264_clip() {
    const fs::path p = file("testsrc2.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=16 -frames:v 16 -c:v libx264 -pix_fmt yuv420p "
           "-g 8 -bf 3 " + quote(p));
    return p;
  }

  test::ScratchDir scratch_{"video_decoder"};
  fs::path dir_{scratch_.path()};
};

TEST_F(VideoDecoder, DecodesH264ExactlyLikeTheFfmpegCli) {
  SKIP_WITHOUT_DECODING();
  const fs::path clip = make_h264_clip();
  const DecodedVideo v = decode_video(clip.string());
  ASSERT_EQ(v.frames.sizes(), (at::IntArrayRef{16, 48, 64, 3}));
  EXPECT_EQ(v.frames.scalar_type(), at::kByte);
  EXPECT_TRUE(v.frames.is_contiguous());
  EXPECT_EQ(v.width, 64);
  EXPECT_EQ(v.height, 48);
  EXPECT_DOUBLE_EQ(v.fps, 16.0);
  EXPECT_TRUE(same_frames(v.frames, cli_decode(clip, 48, 64)));
  // Frames differ from each other (the test source animates), so order is checked too.
  EXPECT_FALSE(at::equal(v.frames[0], v.frames[15]));

  // Thread count changes speed, never pixels.
  EXPECT_TRUE(same_frames(decode_video(clip.string(), -1, 1).frames, v.frames));
  EXPECT_TRUE(same_frames(decode_video(clip.string(), -1, 3).frames, v.frames));
}

TEST_F(VideoDecoder, DecodesOddSizes) {
  SKIP_WITHOUT_DECODING();
  // 4:4:4 H.264 (x264 refuses odd sizes in 4:2:0) and 4:2:0 VP9 (odd chroma planes round up).
  const fs::path h264 = file("odd_444.mp4"), vp9 = file("odd_420.webm");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc=size=33x17:rate=10 -frames:v 8 -c:v libx264 "
                     "-pix_fmt yuv444p " + quote(h264)));
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc=size=33x17:rate=10 -frames:v 8 -c:v libvpx-vp9 "
                     "-deadline realtime -pix_fmt yuv420p " + quote(vp9)));
  for (const fs::path& p : {h264, vp9}) {
    SCOPED_TRACE(p.string());
    const DecodedVideo v = decode_video(p.string());
    ASSERT_EQ(v.frames.sizes(), (at::IntArrayRef{8, 17, 33, 3}));
    EXPECT_EQ(v.width, 33);
    EXPECT_EQ(v.height, 17);
    EXPECT_DOUBLE_EQ(v.fps, 10.0);
    EXPECT_TRUE(same_frames(v.frames, cli_decode(p, 17, 33)));
  }
}

TEST_F(VideoDecoder, DecodesOtherCodecsAndPixelFormats) {
  SKIP_WITHOUT_DECODING();
  // Full-range JPEG 4:2:2 (yuvj422p), 10-bit H.264 in Matroska, and RGB (PNG) frames.
  const fs::path mjpeg = file("mjpeg.avi"), ten_bit = file("ten_bit.mkv"), png = file("png.mov");
  const std::string src = "-f lavfi -i testsrc=size=50x30:rate=5 -frames:v 4 ";
  ASSERT_TRUE(ffmpeg(src + "-c:v mjpeg " + quote(mjpeg)));
  ASSERT_TRUE(ffmpeg(src + "-c:v libx264 -pix_fmt yuv420p10le " + quote(ten_bit)));
  ASSERT_TRUE(ffmpeg(src + "-c:v png " + quote(png)));
  for (const fs::path& p : {mjpeg, ten_bit, png}) {
    SCOPED_TRACE(p.string());
    const DecodedVideo v = decode_video(p.string());
    ASSERT_EQ(v.frames.sizes(), (at::IntArrayRef{4, 30, 50, 3}));
    EXPECT_DOUBLE_EQ(v.fps, 5.0);
    EXPECT_TRUE(same_frames(v.frames, cli_decode(p, 30, 50)));
  }
}

TEST_F(VideoDecoder, MaxFramesStopsEarly) {
  SKIP_WITHOUT_DECODING();
  const fs::path clip = make_h264_clip();
  const at::Tensor all = decode_video(clip.string()).frames;
  const DecodedVideo five = decode_video(clip.string(), 5);
  ASSERT_EQ(five.frames.sizes(), (at::IntArrayRef{5, 48, 64, 3}));
  EXPECT_TRUE(same_frames(five.frames, all.narrow(0, 0, 5)));
  EXPECT_EQ(decode_video(clip.string(), 1).frames.size(0), 1);
  EXPECT_EQ(decode_video(clip.string(), 100).frames.size(0), 16);  // fewer in the file: all
  expect_error_naming(clip.string(), [&] { decode_video(clip.string(), 0); });
  expect_error_naming(clip.string(), [&] { decode_video(clip.string(), -2); });
  expect_error_naming(clip.string(), [&] { decode_video(clip.string(), -1, -1); });
}

TEST_F(VideoDecoder, RotatedClipComesOutInDisplayOrientation) {
  SKIP_WITHOUT_DECODING();
  // Phones store portrait video as landscape frames plus a display matrix in the MP4 track
  // header. Write a 90-degree matrix into the clip's tkhd box (as `-metadata rotate=90` did in
  // older ffmpeg) and compare with the CLI, which auto-rotates.
  const fs::path clip = make_h264_clip();
  std::vector<char> bytes;
  {
    std::ifstream in(clip, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string tag = "tkhd";
  auto it = std::search(bytes.begin(), bytes.end(), tag.begin(), tag.end());
  ASSERT_NE(it, bytes.end()) << "no tkhd box in " << clip;
  const size_t type_at = static_cast<size_t>(it - bytes.begin());
  const size_t matrix_at = type_at + (bytes[type_at + 4] == 1 ? 56 : 44);
  ASSERT_LE(matrix_at + 36, bytes.size());
  const uint32_t matrix[9] = {0, 0x10000u, 0, 0xFFFF0000u, 0, 0, 48u << 16, 0, 0x40000000u};
  for (int i = 0; i < 9; ++i)
    for (int b = 0; b < 4; ++b) bytes[matrix_at + 4 * i + b] = static_cast<char>(matrix[i] >> (24 - 8 * b));
  const fs::path rotated = file("rotated.mp4");
  {
    std::ofstream out(rotated, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const DecodedVideo v = decode_video(rotated.string());
  ASSERT_EQ(v.frames.sizes(), (at::IntArrayRef{16, 64, 48, 3}));
  EXPECT_EQ(v.width, 48);
  EXPECT_EQ(v.height, 64);
  EXPECT_TRUE(v.frames.is_contiguous());
  EXPECT_TRUE(same_frames(v.frames, cli_decode(rotated, 64, 48)));
  // And it is the unrotated clip turned clockwise.
  const at::Tensor upright = decode_video(clip.string()).frames;
  EXPECT_TRUE(same_frames(v.frames, at::rot90(upright, -1, {1, 2}).contiguous()));
}

TEST_F(VideoDecoder, EncodedMp4RoundTrips) {
  SKIP_WITHOUT_DECODING();
  const at::Tensor pattern = square_pattern(6, 24, 40);
  const fs::path out = file("pattern.mp4");
  encode_video_mp4(out.string(), pattern, 12.0);
  const DecodedVideo v = decode_video(out.string());
  ASSERT_EQ(v.frames.sizes(), pattern.sizes());
  EXPECT_DOUBLE_EQ(v.fps, 12.0);
  EXPECT_LT(mean_abs_diff(v.frames, pattern), 3.0);
  // The file is tagged BT.709; decoding honours the tag exactly as the CLI does.
  EXPECT_TRUE(same_frames(v.frames, cli_decode(out, 24, 40)));

  // Upscaled 2x with nearest neighbour: every pixel becomes a 2x2 block. Also a non-contiguous
  // input view, and overwriting an existing file.
  const at::Tensor channels_first = pattern.permute({0, 3, 1, 2}).contiguous();
  encode_video_mp4(out.string(), channels_first.permute({0, 2, 3, 1}), 12.0, 12, 2);
  const DecodedVideo big = decode_video(out.string());
  ASSERT_EQ(big.frames.sizes(), (at::IntArrayRef{6, 48, 80, 3}));
  EXPECT_EQ(big.width, 80);
  EXPECT_EQ(big.height, 48);
  const at::Tensor expected = pattern.repeat_interleave(2, 1).repeat_interleave(2, 2);
  EXPECT_LT(mean_abs_diff(big.frames, expected), 3.0);

  // Odd sizes and a fractional frame rate.
  const at::Tensor odd = square_pattern(3, 17, 33);
  encode_video_mp4(out.string(), odd, 30000.0 / 1001.0, 0);
  const DecodedVideo o = decode_video(out.string());
  ASSERT_EQ(o.frames.sizes(), odd.sizes());
  EXPECT_NEAR(o.fps, 30000.0 / 1001.0, 1e-6);
  EXPECT_LT(mean_abs_diff(o.frames, odd), 3.0);
}

TEST_F(VideoDecoder, EncoderRejectsBadArguments) {
  const std::string out = file("bad.mp4").string();
  const at::Tensor ok = square_pattern(2, 8, 8);
  expect_error_naming(out, [&] { encode_video_mp4(out, ok.to(at::kFloat), 8); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok[0], 8); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok.narrow(3, 0, 2), 8); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok.narrow(0, 0, 0), 8); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok, 0); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok, 8, 52); });
  expect_error_naming(out, [&] { encode_video_mp4(out, ok, 8, 12, 0); });
  const std::string nowhere = file("no_such_dir/clip.mp4").string();
  const std::string msg = expect_error_naming(nowhere, [&] { encode_video_mp4(nowhere, ok, 8); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(VideoDecoder, MissingFileErrorNamesIt) {  // in every build, FFmpeg or not
  const std::string missing = file("missing.mp4").string();
  expect_error_naming(missing, [&] { decode_video(missing); });
}

TEST_F(VideoDecoder, UndecodableFilesThrowNamingTheFile) {
  SKIP_WITHOUT_DECODING();
  const std::string missing = file("missing.mp4").string();
  EXPECT_NE(expect_error_naming(missing, [&] { decode_video(missing); }).find("does not exist"),
            std::string::npos);

  const std::string random = file("random.mp4").string();
  {
    std::mt19937 rng(1234);
    std::ofstream out(random, std::ios::binary);
    for (int i = 0; i < 65536; ++i) out.put(static_cast<char>(rng() & 0xFF));
  }
  expect_error_naming(random, [&] { decode_video(random); });

  const std::string empty = file("empty.mp4").string();
  std::ofstream(empty, std::ios::binary).close();
  expect_error_naming(empty, [&] { decode_video(empty); });

  expect_error_naming(dir_.string(), [&] { decode_video(dir_.string()); });

  // A valid MP4 whose video payload is noise: the container opens, no frame decodes.
  const fs::path clip = make_h264_clip();
  std::vector<char> bytes;
  {
    std::ifstream in(clip, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string tag = "mdat";
  auto it = std::search(bytes.begin(), bytes.end(), tag.begin(), tag.end());
  ASSERT_NE(it, bytes.end());
  const size_t type_at = static_cast<size_t>(it - bytes.begin());
  ASSERT_GE(type_at, 4u);
  size_t box_size = 0;
  for (int b = 0; b < 4; ++b) box_size = box_size << 8 | static_cast<uint8_t>(bytes[type_at - 4 + b]);
  ASSERT_LE(type_at - 4 + box_size, bytes.size());
  std::mt19937 rng(99);
  for (size_t i = type_at + 4; i < type_at - 4 + box_size; ++i) bytes[i] = static_cast<char>(rng() & 0xFF);
  const std::string noise = file("noise_payload.mp4").string();
  {
    std::ofstream out(noise, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string msg = expect_error_naming(noise, [&] { decode_video(noise); });
  EXPECT_NE(msg.find("no frame could be decoded"), std::string::npos) << msg;

  const fs::path m4a = file("sine.m4a"), mp3 = file("sine.mp3");
  ASSERT_TRUE(ffmpeg("-f lavfi -i sine=frequency=440:duration=0.5 -c:a aac " + quote(m4a)));
  ASSERT_TRUE(ffmpeg("-f lavfi -i sine=frequency=440:duration=0.5 -c:a libmp3lame " + quote(mp3)));
  for (const fs::path& p : {m4a, mp3}) {
    const std::string msg = expect_error_naming(p.string(), [&] { decode_video(p.string()); });
    EXPECT_NE(msg.find("no video stream"), std::string::npos) << msg;
  }
}


// Unusable inputs not covered above (random bytes, empty, audio-only, missing, directory, noise
// payload are): a truncated MP4 whose index (moov) was cut off, and requests that no file can
// satisfy. A truncated stream whose header survives decodes up to the cut (see the header).
TEST_F(VideoDecoder, TruncatedFilesAndImpossibleClipsThrowNamingTheFile) {
  SKIP_WITHOUT_DECODING();
  const fs::path clip = make_h264_clip();  // moov at the end, as ffmpeg writes by default
  std::vector<char> bytes;
  {
    std::ifstream in(clip, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = file("cut.mp4").string();
  {
    std::ofstream out(cut, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  DecodeOptions o = cpu_options();
  std::string msg = expect_error_naming(cut, [&] { decode_video(cut, o); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  // Matroska cut in the middle: the frames before the cut, no error.
  const fs::path mkv = file("whole.mkv");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=16 -frames:v 32 -c:v libx264 -g 4 " +
                     quote(mkv)));
  {
    std::ifstream in(mkv, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string mkv_cut = file("cut.mkv").string();
  {
    std::ofstream out(mkv_cut, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  const DecodedVideo prefix = decode_video(mkv_cut, o);
  EXPECT_GT(prefix.frames.size(0), 0);
  EXPECT_LT(prefix.frames.size(0), 32);
  EXPECT_TRUE(same_frames(prefix.frames, decode_video(mkv.string(), o).frames.narrow(0, 0, prefix.frames.size(0))));

  // A window after the end of a 1-second clip; and options no clip can satisfy.
  const std::string path = clip.string();
  o.start_seconds = 5;
  msg = expect_error_naming(path, [&] { decode_video(path, o); });
  EXPECT_NE(msg.find("no frame in the clip window"), std::string::npos) << msg;
  const auto bad = [&](auto edit) {
    DecodeOptions b = cpu_options();
    edit(b);
    expect_error_naming(path, [&] { decode_video(path, b); });
  };
  bad([](DecodeOptions& b) { b.start_seconds = -1; });
  bad([](DecodeOptions& b) { b.start_seconds = std::nan(""); });
  bad([](DecodeOptions& b) { b.end_seconds = 0; });
  bad([](DecodeOptions& b) { b.start_seconds = 0.5; b.end_seconds = 0.5; });
  bad([](DecodeOptions& b) { b.target_fps = -1; });
  bad([](DecodeOptions& b) { b.target_fps = INFINITY; });
  bad([](DecodeOptions& b) { b.max_frames = 0; });
  bad([](DecodeOptions& b) { b.threads = -2; });
  bad([](DecodeOptions& b) { b.cuda_device = -2; });
}

TEST(DecodeOptions, DeviceNamesRoundTrip) {
  for (DecodeDevice d : {DecodeDevice::kAuto, DecodeDevice::kCpu, DecodeDevice::kNvdec})
    EXPECT_EQ(parse_decode_device(decode_device_name(d)), d);
  try {
    parse_decode_device("gpu", "data.decode_device");
    ADD_FAILURE() << "no error for 'gpu'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.decode_device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vidit
