// decode_video with DecodeOptions against the ffmpeg CLI on clips it makes in a temp dir: every
// codec the data pipeline meets (H.264, HEVC, VP9, AV1; odd sizes, portrait, 10-bit), frame-exact
// seeking (`-ss`, `select`), resampling (`fps=F:round=up`), variable frame rate, non-square
// pixels, and the NVDEC fallback. Full-file decodes of the simpler cases live in
// video_decoder_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "video/video_decoder.h"
#include "../../tests/test_util.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

using namespace video_test;  // NOLINT: the shared ffmpeg CLI helpers

std::string seconds_arg(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f", s);
  return buf;
}

// Source index of each frame of `got` in `source` (by exact equality), -1 where none matches.
std::vector<int> source_indices(const at::Tensor& got, const at::Tensor& source) {
  std::vector<int> out;
  for (int64_t t = 0; t < got.size(0); ++t) {
    int found = -1;
    for (int64_t i = 0; i < source.size(0) && found < 0; ++i)
      if (at::equal(got[t], source[i])) found = static_cast<int>(i);
    out.push_back(found);
  }
  return out;
}

class VideoDecodeClip : public ::testing::Test {
 protected:
  fs::path file(const std::string& name) const { return dir_ / name; }

  // Frames whose colour says which frame they are: frame N is flat grey 16 + 10 N (limited
  // range), coded losslessly, so every output frame can be traced to its source frame.
  fs::path make_numbered_clip(const std::string& name, int frames, int rate,
                              const std::string& extra_filter = "") {
    const fs::path p = file(name);
    ffmpeg("-f lavfi -i \"color=black:size=32x32:rate=" + std::to_string(rate) +
           ",geq=lum='16+10*N':cb=128:cr=128" + extra_filter + "\" -frames:v " +
           std::to_string(frames) + " -fps_mode passthrough -c:v libx264 -qp 0 -pix_fmt yuv444p " +
           quote(p));
    return p;
  }

  test::ScratchDir scratch_{"video_decode_clip"};
  fs::path dir_{scratch_.path()};
};

struct CodecCase {
  std::string name;    // file name
  std::string encode;  // ffmpeg output options
  int64_t w, h;
  std::string source = "testsrc2";  // lavfi source (testsrc2 rounds odd sizes down; testsrc not)
};

// The AV1 encoder this ffmpeg has, as output options for a 64x64 clip; empty if none.
std::string av1_encoder() {
  if (ffmpeg_has_encoder("libaom-av1")) return "-c:v libaom-av1 -cpu-used 8 -g 10 -pix_fmt yuv420p";
  if (ffmpeg_has_encoder("librav1e")) return "-c:v librav1e -speed 10 -g 10 -pix_fmt yuv420p";
  if (ffmpeg_has_encoder("libsvtav1")) return "-c:v libsvtav1 -preset 12 -g 10 -pix_fmt yuv420p";
  return "";
}

// For each codec: the whole file equals the CLI's decode, and a clip started at frame i (at its
// exact time, or half a frame before it) has exactly the frames i, i+1, ... of the whole file
// (what the CLI's `select` gives for those indices). Starts cover key frames, the frames just
// before and after them, HEVC's open-GOP leading pictures and VP9's hidden alt-ref frames (GOP of
// 10 with B-frames), and the last frame; containers with an index (MP4, Matroska, WebM) and
// without (MPEG-TS).
//
// `ffmpeg -ss T -i F` itself is not always frame-exact. In an open-GOP HEVC MP4 it seeks to the
// CRA key frame whose decode time is before T and so drops the leading pictures displayed before
// the CRA (FFmpeg 5.1: start frames 9 and 19 come out as frames 10 and 20); in MPEG-TS it lands
// on later key frames (frame 9 -> 10, 25 -> 30, 39 -> nothing at all). decode_video notices
// that the first decoded frame is late and seeks further back. Where the CLI's -ss is exact,
// the clip must equal its output too; where it is not, a note is printed.
TEST_F(VideoDecodeClip, SeeksFrameExactlyInEveryCodec) {
  SKIP_WITHOUT_DECODING();
  std::vector<CodecCase> cases = {
      {"h264.mp4", "-c:v libx264 -pix_fmt yuv420p -g 10 -bf 3", 64, 48},
      {"h264_portrait.mp4", "-c:v libx264 -pix_fmt yuv420p -g 10 -bf 2", 48, 64},
      // MPEG-TS: no index (seeking bisects timestamps) and a start time of 1.4 s, from which
      // clip times count.
      {"h264.ts", "-c:v libx264 -pix_fmt yuv420p -g 10 -bf 3", 64, 48},
      {"hevc.mp4",
       "-c:v libx265 -pix_fmt yuv420p -x265-params log-level=error:keyint=10:bframes=3", 64, 48},
      {"hevc_10bit.mkv",
       "-c:v libx265 -pix_fmt yuv420p10le -x265-params log-level=error:keyint=10:bframes=2", 64,
       48},
      {"vp9_odd.webm",
       "-c:v libvpx-vp9 -deadline good -cpu-used 8 -g 10 -auto-alt-ref 1 -lag-in-frames 8 "
       "-pix_fmt yuv420p",
       35, 19, "testsrc"},
  };
  const std::string av1 = av1_encoder();
  if (!av1.empty()) cases.push_back({"av1.mkv", av1, 64, 64});
  const double fps = 20;
  for (const CodecCase& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path p = file(c.name);
    ASSERT_TRUE(ffmpeg("-f lavfi -i " + c.source + "=size=" + std::to_string(c.w) + "x" +
                       std::to_string(c.h) + ":rate=20 -frames:v 40 " + c.encode + " " + quote(p)));
    const DecodedVideo all = decode_video(p.string(), cpu_options());
    ASSERT_EQ(all.frames.sizes(), (at::IntArrayRef{40, c.h, c.w, 3}));
    ASSERT_TRUE(same_frames(all.frames, cli_decode(p, c.h, c.w)));
    ASSERT_EQ(all.timestamps.size(), 40u);
    for (int i = 0; i < 40; ++i) EXPECT_NEAR(all.timestamps[i], i / fps, 1e-9) << i;

    for (int i : {1, 9, 10, 11, 19, 25, 39}) {
      SCOPED_TRACE("start frame " + std::to_string(i));
      const int64_t n = std::min(4, 40 - i);
      DecodeOptions o = cpu_options();
      o.start_seconds = i / fps;
      o.end_seconds = (i + n) / fps;
      const DecodedVideo clip = decode_video(p.string(), o);
      EXPECT_TRUE(same_frames(clip.frames, all.frames.narrow(0, i, n)));
      // It seeked: decoding started at most about two GOPs (of 10) before the start.
      EXPECT_LE(clip.frames_decoded, n + 22) << "decoded " << clip.frames_decoded;
      ASSERT_EQ(clip.timestamps.size(), static_cast<size_t>(clip.frames.size(0)));
      if (!clip.timestamps.empty()) {
        EXPECT_NEAR(clip.timestamps[0], i / fps, 1e-9);
      }
      const at::Tensor cli_ss =
          cli_frames(p, c.h, c.w, "-ss " + seconds_arg(i / fps), "-frames:v " + std::to_string(n));
      if (same_frames(cli_ss, all.frames.narrow(0, i, n)))
        EXPECT_TRUE(same_frames(clip.frames, cli_ss));
      else
        std::printf("[ note ] ffmpeg -ss %s is not frame-exact at frame %d of %s; decode_video is\n",
                    seconds_arg(i / fps).c_str(), i, c.name.c_str());
      // Half a frame early: the first frame at or after the start is frame i.
      o.start_seconds = (i - 0.5) / fps;
      o.end_seconds = std::numeric_limits<double>::infinity();
      o.max_frames = 1;
      EXPECT_TRUE(same_frames(decode_video(p.string(), o).frames, all.frames.narrow(0, i, 1)));
    }
  }
  if (av1.empty())
    GTEST_SKIP() << "no AV1 encoder (libaom-av1, librav1e, libsvtav1) in this ffmpeg; AV1 untested";
}

TEST_F(VideoDecodeClip, ClipEqualsTheCliSelectOnTheSameIndices) {
  SKIP_WITHOUT_DECODING();
  const fs::path p = file("select.mp4");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=25 -frames:v 50 -c:v libx264 "
                     "-pix_fmt yuv420p -g 12 -bf 3 " + quote(p)));
  for (const auto& [first, last] : {std::pair{13, 20}, std::pair{24, 24}, std::pair{36, 49}}) {
    DecodeOptions o = cpu_options();
    o.start_seconds = first / 25.0;
    o.end_seconds = (last + 1) / 25.0;
    const at::Tensor want =
        cli_frames(p, 48, 64, "", "-vf \"select=between(n\\," + std::to_string(first) + "\\," +
                                       std::to_string(last) + ")\"");
    ASSERT_EQ(want.size(0), last - first + 1);
    EXPECT_TRUE(same_frames(decode_video(p.string(), o).frames, want)) << first << ".." << last;
  }
}

// Resampling picks, for output time t0 + k / F, the frame on screen at that time, which is the
// CLI's fps filter with round=up (not its default round=near). Checked on numbered frames, so a
// wrong pick shows as a wrong index, and against the live CLI.
TEST_F(VideoDecodeClip, ResamplesLikeTheFpsFilterWithRoundUp) {
  SKIP_WITHOUT_DECODING();
  const fs::path p = make_numbered_clip("numbered.mp4", 10, 10);
  const at::Tensor all = decode_video(p.string(), cpu_options()).frames;
  ASSERT_EQ(all.size(0), 10);
  ASSERT_EQ(source_indices(all, all), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));

  struct Case {
    double fps, start;
    std::vector<int> want;  // frame i is on screen during [i/10, (i+1)/10)
    double first_time;      // of the first output frame
  };
  const std::vector<Case> cases = {
      {20, 0, {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9}, 0},
      {7, 0, {0, 1, 2, 4, 5, 7, 8}, 0},
      {3, 0, {0, 3, 6}, 0},
      {4, 0, {0, 2, 5, 7}, 0},
      {4, 0.35, {6, 8}, 0.6},  // kept frames 4..9 (0.4 s on); slots 0.35 + k/4 from k = 1
      // NTSC rate from 0.2 s: frames 2..9, slots 0.2 + k * 1001/30000 s for k < ceil(0.8 * 29.97)
      {30000.0 / 1001, 0.2, {2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8, 9, 9, 9},
       0.2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("fps " + std::to_string(c.fps) + " start " + std::to_string(c.start));
    DecodeOptions o = cpu_options();
    o.target_fps = c.fps;
    o.start_seconds = c.start;
    const DecodedVideo v = decode_video(p.string(), o);
    EXPECT_EQ(source_indices(v.frames, all), c.want);
    EXPECT_NEAR(v.fps, c.fps, 1e-9);
    const std::string ss = c.start > 0 ? "-ss " + seconds_arg(c.start) : "";
    char filter[96];  // the same double, so that the CLI's av_d2q gives the same rational
    std::snprintf(filter, sizeof(filter), "-vf fps=%.17g:round=up", c.fps);
    EXPECT_TRUE(same_frames(v.frames, cli_frames(p, 32, 32, ss, filter)));
    // The grid's times: the first kept frame's slot on, 1/fps apart.
    ASSERT_EQ(v.timestamps.size(), c.want.size());
    EXPECT_NEAR(v.timestamps[0], c.first_time, 1e-9);
    for (size_t k = 1; k < v.timestamps.size(); ++k)
      EXPECT_NEAR(v.timestamps[k] - v.timestamps[k - 1], 1 / c.fps, 1e-9);
  }

  // An end and a frame limit cut the grid.
  DecodeOptions o = cpu_options();
  o.target_fps = 20;
  o.end_seconds = 0.42;  // slots 0 .. 0.40 s
  EXPECT_EQ(source_indices(decode_video(p.string(), o).frames, all),
            (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3, 4}));
  o.max_frames = 3;
  EXPECT_EQ(source_indices(decode_video(p.string(), o).frames, all), (std::vector<int>{0, 0, 1}));
}

// A clip at 10 fps for a second, then 25 fps: timestamps, not frame counts, decide which frame is
// at which time, for native decoding, seeking and resampling.
TEST_F(VideoDecodeClip, VariableFrameRate) {
  SKIP_WITHOUT_DECODING();
  // Frame N at 100 N ms for N < 10, then 1000 + 40 (N - 10) ms; numbered by colour.
  const std::string vfr = ",settb=1/1000,setpts='if(lt(N\\,10)\\,N*100\\,1000+(N-10)*40)'";
  for (const std::string name : {"vfr.mp4", "vfr.mkv"}) {
    SCOPED_TRACE(name);
    const fs::path p = make_numbered_clip(name, 20, 25, vfr);
    const DecodedVideo all = decode_video(p.string(), cpu_options());
    ASSERT_EQ(all.frames.size(0), 20);
    ASSERT_EQ(source_indices(all.frames, all.frames)[19], 19);
    EXPECT_TRUE(same_frames(all.frames, cli_decode(p, 32, 32)));
    for (int n = 0; n < 20; ++n)
      EXPECT_NEAR(all.timestamps[n], n < 10 ? n * 0.1 : 1.0 + (n - 10) * 0.04, 1e-9) << n;

    // Seek into the fast part: 1.08 s is frame 12.
    DecodeOptions o = cpu_options();
    o.start_seconds = 1.08;
    o.end_seconds = 1.2;
    EXPECT_EQ(source_indices(decode_video(p.string(), o).frames, all.frames),
              (std::vector<int>{12, 13, 14}));
    EXPECT_TRUE(same_frames(decode_video(p.string(), o).frames,
                            cli_frames(p, 32, 32, "-ss 1.080000", "-frames:v 3")));

    // Resampled to 10 fps: one frame per 100 ms, whatever the spacing around it. (In the MP4 the
    // last frame lasts 40 ms, so the stream ends at 1.4 s.)
    o = cpu_options();
    o.target_fps = 10;
    o.end_seconds = 1.4;
    const DecodedVideo r = decode_video(p.string(), o);
    EXPECT_EQ(source_indices(r.frames, all.frames),
              (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 17}));
    ASSERT_EQ(r.timestamps.size(), 14u);
    for (int k = 0; k < 14; ++k) EXPECT_NEAR(r.timestamps[k], k * 0.1, 1e-9) << k;
    EXPECT_EQ(r.frames_decoded, 20);  // every source frame decoded once, whatever is dropped
    EXPECT_TRUE(same_frames(r.frames, cli_frames(p, 32, 32, "", "-t 1.4 -vf fps=10:round=up")));
  }
}

// `-vf setsar=2` marks pixels as twice as wide as tall: reported as 2:1; square_pixels stretches
// the width like the CLI's `scale=iw*sar:ih`; a quarter-turn rotation turns the ratio over.
TEST_F(VideoDecodeClip, NonSquarePixels) {
  SKIP_WITHOUT_DECODING();
  const fs::path p = file("sar2.mp4");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=32x18:rate=10 -frames:v 5 -vf setsar=2 -c:v "
                     "libx264 -pix_fmt yuv420p " + quote(p)));
  DecodeOptions o = cpu_options();
  const DecodedVideo coded = decode_video(p.string(), o);
  EXPECT_EQ(coded.frames.sizes(), (at::IntArrayRef{5, 18, 32, 3}));
  EXPECT_EQ(coded.sar_num, 2);
  EXPECT_EQ(coded.sar_den, 1);
  EXPECT_TRUE(same_frames(coded.frames, cli_decode(p, 18, 32)));

  o.square_pixels = true;
  const DecodedVideo square = decode_video(p.string(), o);
  EXPECT_EQ(square.frames.sizes(), (at::IntArrayRef{5, 18, 64, 3}));
  EXPECT_EQ(square.width, 64);
  EXPECT_EQ(square.sar_num, 1);
  EXPECT_EQ(square.sar_den, 1);
  EXPECT_TRUE(same_frames(square.frames, cli_frames(p, 18, 64, "", "-vf scale=iw*sar:ih")));

  // Square pixels already: nothing changes.
  const fs::path plain = file("sar1.mp4");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=32x18:rate=10 -frames:v 2 -c:v libx264 " + quote(plain)));
  const DecodedVideo same = decode_video(plain.string(), o);
  EXPECT_EQ(same.width, 32);
  EXPECT_EQ(same.sar_num, 1);
}

// device=auto on a machine without NVDEC decodes in software (the same pixels as cpu) and says
// so in exactly one line per process; device=nvdec there is an error naming the file and the
// reason. On a machine with NVDEC: nvdec decodes and stays close to software (the NV12 download
// takes a different conversion path, so not bit-exact).
TEST_F(VideoDecodeClip, NvdecAutoFallsBackWithOneLogLine) {
  SKIP_WITHOUT_DECODING();
  if (const char* clip = std::getenv("VIDIT_TEST_AUTO_DECODES_OF")) {
    // The child half (see below): three auto decodes in a fresh process.
    for (int i = 0; i < 3; ++i) EXPECT_EQ(decode_video(clip, DecodeOptions{}).frames.size(0), 5);
    std::printf("child decoded\n");
    return;
  }
  const fs::path p = file("small.mp4");
  ASSERT_TRUE(ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=10 -frames:v 5 -c:v libx264 "
                     "-pix_fmt yuv420p " + quote(p)));
  const at::Tensor cpu = decode_video(p.string(), cpu_options()).frames;

  DecodeOptions nv;
  nv.device = DecodeDevice::kNvdec;
  bool have_nvdec = true;
  try {
    const at::Tensor gpu = decode_video(p.string(), nv).frames;
    ASSERT_EQ(gpu.sizes(), cpu.sizes());
    EXPECT_LT(mean_abs_diff(gpu, cpu), 2.0);
  } catch (const Error& e) {
    have_nvdec = false;
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("device=nvdec"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
  }

  DecodeOptions aut;
  const at::Tensor automatic = decode_video(p.string(), aut).frames;
  if (!have_nvdec) {
    EXPECT_TRUE(same_frames(automatic, cpu));
  }

  // One line per process: count it in a fresh process that decodes three times.
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string cmd = "VIDIT_TEST_AUTO_DECODES_OF=" + quote(p) + " " + quote(self) +
                          " --gtest_filter=VideoDecodeClip.NvdecAutoFallsBackWithOneLogLine 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("child decoded"), std::string::npos) << output;
  size_t lines = 0;
  for (size_t at = output.find("vidit: NVDEC unavailable"); at != std::string::npos;
       at = output.find("vidit: NVDEC unavailable", at + 1))
    ++lines;
  EXPECT_EQ(lines, have_nvdec ? 0u : 1u) << output;
}

}  // namespace
}  // namespace vidit
