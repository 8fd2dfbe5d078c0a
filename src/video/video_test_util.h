// Helpers for the video decoder tests: run the ffmpeg CLI to make clips and to decode reference
// frames, compare frames, expect errors that name a file. Test-only (included by *_test.cpp).
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "video/video_decoder.h"

namespace vidit::video_test {

namespace fs = std::filesystem;

inline bool ffmpeg_cli_available() {
  static const bool ok =
      std::system("ffmpeg -hide_banner -loglevel error -version >/dev/null 2>&1") == 0;
  return ok;
}

// True when this ffmpeg has the encoder `name` (e.g. "libx265").
inline bool ffmpeg_has_encoder(const std::string& name) {
  const std::string cmd = "ffmpeg -hide_banner -loglevel error -h encoder=" + name +
                          " 2>/dev/null | grep -q 'Encoder " + name + " '";
  return std::system(cmd.c_str()) == 0;
}

#define SKIP_WITHOUT_FFMPEG_CLI()                                                    \
  do {                                                                               \
    if (!::vidit::video_test::ffmpeg_cli_available())                                \
      GTEST_SKIP() << "the ffmpeg program is not on PATH";                           \
  } while (0)

#define SKIP_WITHOUT_DECODING()                                                              \
  do {                                                                                       \
    if (!::vidit::video_decoding_available())                                                \
      GTEST_SKIP() << "this build has no FFmpeg decode support";                             \
    SKIP_WITHOUT_FFMPEG_CLI();                                                               \
  } while (0)

inline std::string quote(const fs::path& p) {
  std::string out = "'";
  for (char c : p.string()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `ffmpeg <args>` quietly; true on success.
inline bool ffmpeg(const std::string& args) {
  const std::string cmd = "ffmpeg -hide_banner -nostdin -loglevel error -y " + args;
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "command failed: " << cmd;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The ffmpeg CLI's decode of `file` to [T, H, W, 3] uint8 RGB:
// `ffmpeg <input_args> -i FILE <output_args> -fps_mode passthrough -f rawvideo -pix_fmt rgb24 -`.
inline at::Tensor cli_frames(const fs::path& file, int64_t h, int64_t w,
                             const std::string& input_args = "",
                             const std::string& output_args = "") {
  const std::string cmd = "ffmpeg -hide_banner -nostdin -loglevel error " + input_args + " -i " +
                          quote(file) + " " + output_args +
                          " -fps_mode passthrough -f rawvideo -pix_fmt rgb24 -";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run: " << cmd;
    return {};
  }
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "command failed: " << cmd;
  const int64_t frame_bytes = h * w * 3;
  EXPECT_EQ(bytes.size() % frame_bytes, 0u) << cmd << " gave a partial frame for " << h << "x" << w;
  const int64_t t = static_cast<int64_t>(bytes.size()) / frame_bytes;
  return at::from_blob(bytes.data(), {t, h, w, 3}, at::kByte).clone();
}

// The CLI's plain decode of the whole file.
inline at::Tensor cli_decode(const fs::path& file, int64_t h, int64_t w) {
  return cli_frames(file, h, w);
}

inline double mean_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().mean().item<double>();
}

inline ::testing::AssertionResult same_frames(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << want.sizes();
  for (int64_t t = 0; t < got.size(0); ++t) {
    if (!at::equal(got[t], want[t])) {
      const double max_diff = (got[t].to(at::kInt) - want[t].to(at::kInt)).abs().max().item<int>();
      return ::testing::AssertionFailure() << "frame " << t << " differs: max abs diff " << max_diff
                                           << ", mean abs diff " << mean_abs_diff(got[t], want[t]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Calls fn, expecting a vidit::Error whose message names `path`; returns the message.
template <typename Fn>
std::string expect_error_naming(const std::string& path, Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name '" << path << "': " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected vidit::Error for '" << path << "', got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected vidit::Error for '" << path << "', nothing was thrown";
  return {};
}

// Software decode options (bit-exact with the CLI on every machine, GPU or not).
inline DecodeOptions cpu_options() {
  DecodeOptions o;
  o.device = DecodeDevice::kCpu;
  return o;
}

}  // namespace vidit::video_test
