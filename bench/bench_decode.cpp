// Decode throughput of decode_video against the ffmpeg CLI, same files and thread count, one run.
//   bench_decode [--threads N] [--size WxH] [--frames N] [--repeat R] [--codecs h264,hevc,vp9,av1]
//                [--dir D]   (keeps the generated clips in D and reuses them on the next run)
// For each codec a testsrc2 clip is made with the ffmpeg CLI, then timed (best of R, wall clock):
//   ours      decode_video(FILE, {device=cpu, threads=N}): demux + decode + RGB24 conversion +
//             copy into the returned [T, H, W, 3] tensor
//   cli       ffmpeg -threads N -i FILE -f null -            decode only: `-f null` converts
//             nothing to RGB
//   cli+rgb   ffmpeg -threads N -i FILE -pix_fmt rgb24 -f null -   decode + the same libswscale
//             conversion to RGB24 (no copy out)
// The CLI's times include starting the process (exec + loading FFmpeg's shared libraries); that
// start-up, timed as `ffmpeg -version`, is printed and also subtracted in the `-start` column.
// Ratios are frames/s ours over frames/s CLI (goal >= 0.95), by wall time and by CPU time (user +
// system, from getrusage; steadier than wall time on a machine shared with other work).
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "video/video_decoder.h"

using namespace vidit;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool run(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

bool has_encoder(const std::string& name) {
  return run("ffmpeg -hide_banner -loglevel error -h encoder=" + name + " 2>/dev/null | grep -q 'Encoder " +
             name + " '");
}

// Output options for each codec, chosen for encoding speed; empty if this ffmpeg lacks the encoder.
std::string encoder_args(const std::string& codec) {
  if (codec == "h264") return "-c:v libx264 -preset veryfast -g 50 -bf 3 -pix_fmt yuv420p";
  if (codec == "hevc" && has_encoder("libx265"))
    return "-c:v libx265 -preset ultrafast -pix_fmt yuv420p -x265-params log-level=error:keyint=50";
  if (codec == "vp9" && has_encoder("libvpx-vp9"))
    return "-c:v libvpx-vp9 -deadline realtime -cpu-used 8 -row-mt 1 -g 50 -pix_fmt yuv420p";
  if (codec == "av1") {
    if (has_encoder("libsvtav1")) return "-c:v libsvtav1 -preset 12 -g 50 -pix_fmt yuv420p";
    if (has_encoder("libaom-av1")) return "-c:v libaom-av1 -cpu-used 8 -row-mt 1 -g 50 -pix_fmt yuv420p";
    if (has_encoder("librav1e")) return "-c:v librav1e -speed 10 -g 50 -pix_fmt yuv420p";
  }
  return "";
}

// CPU seconds (user + system) used so far by this process, or by its finished children.
double cpu_s(int who) {
  rusage u{};
  getrusage(who, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Wall and CPU time of one call of fn; CPU time counted for `who` (RUSAGE_SELF: our decoder and
// its threads; RUSAGE_CHILDREN: the ffmpeg processes fn runs).
struct Cost {
  double wall = 1e30, cpu = 1e30;
};
template <typename Fn>
void measure(Cost& best, int who, Fn fn) {
  const double c0 = cpu_s(who), t0 = now_s();
  fn();
  best.wall = std::min(best.wall, now_s() - t0);
  best.cpu = std::min(best.cpu, cpu_s(who) - c0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode throughput: vidit decode_video vs the ffmpeg CLI"};
  int threads = 2, frames = 300, repeat = 3;
  std::string size = "640x360", codecs = "h264,hevc,vp9,av1", dir;
  app.add_option("--threads", threads, "decoder threads, both sides (0 = one per core)");
  app.add_option("--size", size, "WxH of the generated clips");
  app.add_option("--frames", frames, "frames per clip (25 fps)");
  app.add_option("--repeat", repeat, "timed runs per measurement; the best counts");
  app.add_option("--codecs", codecs, "comma-separated subset of h264,hevc,vp9,av1");
  app.add_option("--dir", dir, "where to keep the clips (default: a temp dir, removed at exit)");
  CLI11_PARSE(app, argc, argv);
  try {
    VIDIT_CHECK(video_decoding_available(), "bench_decode: this build has no FFmpeg decode support");
    VIDIT_CHECK(run("ffmpeg -hide_banner -loglevel error -version >/dev/null 2>&1"),
                "bench_decode: the ffmpeg program is not on PATH");
    const bool temp = dir.empty();
    if (temp) dir = (fs::temp_directory_path() / ("vidit_bench_decode_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);

    const std::string cli = "ffmpeg -hide_banner -nostdin -loglevel error -threads " + std::to_string(threads);
    Cost start_up;
    for (int r = 0; r < repeat; ++r)
      measure(start_up, RUSAGE_CHILDREN, [] { run("ffmpeg -hide_banner -version >/dev/null 2>&1"); });

    std::printf("bench_decode: %s, %d frames, threads %d, best of %d; ffmpeg process start-up "
                "(`ffmpeg -version`) %.1f ms wall, %.1f ms CPU\n",
                size.c_str(), frames, threads, repeat, start_up.wall * 1e3, start_up.cpu * 1e3);
    std::printf("ours = decode_video, INCLUDING the RGB24 conversion and the copy into the returned "
                "tensor; cli = `-f null -`, which converts nothing to RGB; cli+rgb = `-pix_fmt "
                "rgb24 -f null -`, the same libswscale conversion as ours\n");
    std::printf("ratios are frames/s ours / frames/s CLI; -start: the CLI's process start-up "
                "subtracted; cpu: user+system CPU seconds instead of wall time\n");
    std::printf("%-5s %8s %8s %8s | %8s %8s %14s | %8s %8s\n", "codec", "ours", "cli", "cli+rgb",
                "/cli", "/cli+rgb", "/cli+rgb-start", "cpu /cli", "/cli+rgb");
    std::stringstream list(codecs);
    for (std::string codec; std::getline(list, codec, ',');) {
      const std::string args = encoder_args(codec);
      if (args.empty()) {
        std::printf("%-5s skipped: no encoder for it in this ffmpeg\n", codec.c_str());
        continue;
      }
      const std::string file = dir + "/" + codec + "_" + size + "_" + std::to_string(frames) +
                               (codec == "vp9" ? ".webm" : codec == "av1" ? ".mkv" : ".mp4");
      const std::string encode = "ffmpeg -hide_banner -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" +
                                 size + ":rate=25 -frames:v " + std::to_string(frames) + " " + args + " " +
                                 quote(file);
      // (stderr hidden: libsvtav1 prints its banner whatever the log level)
      if (!fs::exists(file))
        VIDIT_CHECK(run(encode + " 2>/dev/null"), "bench_decode: encoding failed; run it to see why: ", encode);

      DecodeOptions o;
      o.device = DecodeDevice::kCpu;
      o.threads = threads;
      int64_t got = decode_video(file, o).frames.size(0);  // warm the page cache and allocator
      VIDIT_CHECK(got == frames, "bench_decode: decoded ", got, " frames of ", file, ", expected ", frames);
      // Interleaved (ours, cli, cli+rgb) rounds, best of each: load from other processes on the
      // machine then affects all three alike.
      Cost ours, plain, rgb;
      for (int r = 0; r < repeat; ++r) {
        measure(ours, RUSAGE_SELF, [&] { decode_video(file, o); });
        measure(plain, RUSAGE_CHILDREN, [&] { run(cli + " -i " + quote(file) + " -f null -"); });
        measure(rgb, RUSAGE_CHILDREN,
                [&] { run(cli + " -i " + quote(file) + " -pix_fmt rgb24 -f null -"); });
      }
      const auto fps = [&](double s) { return frames / std::max(s, 1e-9); };
      std::printf("%-5s %8.0f %8.0f %8.0f | %8.2f %8.2f %14.2f | %8.2f %8.2f\n", codec.c_str(),
                  fps(ours.wall), fps(plain.wall), fps(rgb.wall), plain.wall / ours.wall,
                  rgb.wall / ours.wall, (rgb.wall - start_up.wall) / ours.wall,
                  plain.cpu / ours.cpu, rgb.cpu / ours.cpu);
      std::fflush(stdout);
    }
    if (temp) fs::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
