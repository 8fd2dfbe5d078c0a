// What the `vidit prepare` tests share: real clips made by the ffmpeg CLI in several shapes and
// every kind of unusable input, a manifest naming them (and a broken line), and a config that
// prepares them into a cache and trains on it; and a shell command's exit status. Test-only.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../tests/test_util.h"
#include "video/video_test_util.h"

namespace vidit::prepare_test {

using video_test::ffmpeg;

// Every JSON line of the file at `path` (blank lines skipped).
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The exit status of shell command `cmd` (-1 if it did not exit).
inline int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A scratch folder with videos/, manifest.jsonl and prepare.toml (the cache goes to cache/, a
// run to run/); vidit(args) is the command line of `vidit <args>` on that config.
struct PreparedCache {
  test::ScratchDir dir{"prepare"};
  std::string config;
  std::map<std::string, std::string> caption_of;  // file name -> caption
  std::vector<std::string> bad;                    // file names expected in rejects

  PreparedCache() {
    const std::string v = dir / "videos";
    std::filesystem::create_directories(v);
    // Good clips: landscape 4:3, portrait 3:4, wide 16:9 (VP9 in WebM), 12 frames each at 8 fps.
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/land.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=48x64:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/port.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=96x54:rate=8 -frames:v 12 -c:v libvpx-vp9 -b:v 200k " + v + "/wide.webm");
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/land2.mp4");
    // Unusable: too short (3 frames), too small (16x12), truncated, random bytes, empty,
    // audio only, and a file that does not exist.
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 3 -pix_fmt yuv420p -c:v libx264 " + v + "/short.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=16x12:rate=8 -frames:v 12 -pix_fmt yuv420p -c:v libx264 " + v + "/tiny.mp4");
    {
      std::ifstream in(v + "/land.mp4", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(v + "/truncated.mp4", std::ios::binary) << bytes.substr(0, 300);
      std::string noise(5000, '\0');
      for (size_t i = 0; i < noise.size(); ++i) noise[i] = char((i * 2654435761u) >> 13);
      std::ofstream(v + "/random.mp4", std::ios::binary) << noise;
      std::ofstream(v + "/empty.mp4");
    }
    ffmpeg("-f lavfi -i sine=frequency=440:duration=1 -c:a aac " + v + "/audio.m4a");
    std::ofstream m(dir / "manifest.jsonl");
    for (std::string f : {"land.mp4", "port.mp4", "wide.webm", "land2.mp4"}) {
      caption_of[f] = "clip " + f.substr(0, f.find('.'));
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", caption_of[f]}}.dump() << "\n";
    }
    for (std::string f : {"short.mp4", "tiny.mp4", "truncated.mp4", "random.mp4", "empty.mp4", "audio.m4a", "missing.mp4"}) {
      bad.push_back(f);
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", "bad"}}.dump() << "\n";
    }
    m << "{broken json\n";
    config = dir / "prepare.toml";
    std::ofstream(config) << "[model]\nin_channels = 12\nout_channels = 12\npatch = [1, 2, 2]\n"
                          << "[data]\nsource = \"cache\"\nmanifest = \"" << (dir / "manifest.jsonl") << "\"\n"
                          << "cache_dir = \"" << (dir / "cache") << "\"\ncodec = \"demo\"\nshard_mb = 1\n"
                          << "cache_dtype = \"fp32\"\ndecode_threads = 1\nloader_threads = 2\n"
                          << "[buckets]\nresolutions = [48]\naspect_ratios = [1.3333333, 0.75, 1.7777778]\n"
                          << "frames = [5, 9]\nframe_stride = 4\nmultiple = 8\n"
                          << "[train]\nbatch_size = 2\nsteps = 3\nthreads = 1\nlog_every = 1\nout_dir = \""
                          << (dir / "run") << "\"\n";
  }
  std::string vidit(const std::string& args) const {
    return std::string(VIDIT_BINARY) + " " + args + " --config " + config;
  }
};

}  // namespace vidit::prepare_test
