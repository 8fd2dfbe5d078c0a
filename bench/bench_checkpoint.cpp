// Checkpoint saves, side by side in one run, on one model: how long a save pauses training,
// synchronous (checkpoint.async=false: the step waits for the write, verification and commit)
// against asynchronous (the step waits for the host snapshot only), as a ratio of the step time;
// and the background writer's throughput as a ratio of this disk's sequential write speed,
// measured in the same run by writing 1 GiB to one file in 8 MiB chunks with an fsync right
// before each save (a shared machine's disk drifts by 2x within minutes): each save's write speed
// is divided by the measurement next to it, and the median ratio is reported.
//   bench_checkpoint [--set k=v ...] [--saves N] [--dir D]
// Goals (docs/BENCHMARKS.md): async pause <= 1 step time; writing >= 0.8 of the disk's speed.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/config.h"
#include "core/malloc_tuning.h"
#include "loader/dataset.h"
#include "model/model_info.h"
#include "train/trainer.h"

using namespace vidit;
namespace fs = std::filesystem;

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds to write `bytes` to a new file in `dir` in 8 MiB chunks and fsync it.
static double sequential_write_s(const std::string& dir, uint64_t bytes) {
  const std::string path = dir + "/sequential.bin";
  std::vector<char> chunk(8 << 20, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes; done += chunk.size())
    if (::write(fd, chunk.data(), std::min<uint64_t>(chunk.size(), bytes - done)) < 0) std::perror("write");
  ::fsync(fd);
  ::close(fd);
  const double s = seconds_since(t0);
  fs::remove(path);
  return s;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  keep_freed_memory();
  CLI::App app{"checkpoint save: training pause (sync vs async) and write throughput vs the disk"};
  std::vector<std::string> sets;
  int saves = 3;
  std::string dir = "/tmp/vidit-bench-checkpoint";
  app.add_option("--set", sets, "config overrides");
  app.add_option("--saves", saves, "saves per mode");
  app.add_option("--dir", dir, "where to write (the disk measured)");
  CLI11_PARSE(app, argc, argv);
  // About 100 M parameters (a 1.6 GB state: weights, EMA, AdamW's two moments), few tokens.
  std::vector<std::string> all = {"model.dim=768",         "model.heads=12",       "model.layers=8",
                                  "model.ffn_dim=3072",    "model.text_dim=64",    "model.text_len=8",
                                  "data.source=\"synthetic\"", "data.latent_frames=2", "data.latent_height=4",
                                  "data.latent_width=4",   "train.batch_size=2",   "train.log_every=1000",
                                  "train.steps=1000"};
  all.insert(all.end(), sets.begin(), sets.end());
  fs::remove_all(dir);
  struct Mode {
    const char* name;
    bool async;
    std::vector<double> pause, write, step, quiet, disk;
    double bytes = 0;
  };
  std::vector<Mode> modes = {{"synchronous", false, {}, {}, {}, {}, {}}, {"asynchronous", true, {}, {}, {}, {}, {}}};
  double params = 0;
  // The disk is measured right before each save (it drifts on a shared machine).
  const uint64_t probe_bytes = 1ull << 30;
  fs::create_directories(dir);
  for (Mode& m : modes) {
    std::vector<std::string> s = all;
    s.push_back("train.out_dir=\"" + dir + "/" + m.name + "\"");
    s.push_back(std::string("checkpoint.async=") + (m.async ? "true" : "false"));
    Config cfg = parse_config("", "<bench>", s);
    params = double(model_info(cfg).params);
    Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 64, 1), at::zeros({cfg.model.text_len, cfg.model.text_dim}));
    t.step();  // warm-up
    for (int i = 0; i < saves; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      t.step();  // no save in flight
      m.quiet.push_back(seconds_since(t0));
      m.disk.push_back(probe_bytes / 1e6 / sequential_write_s(dir, probe_bytes));
      t0 = std::chrono::steady_clock::now();
      t.start_save();
      m.pause.push_back(seconds_since(t0));
      // Training goes on; the next steps overlap the write (async), then the save is finished.
      auto t1 = std::chrono::steady_clock::now();
      t.step();
      m.step.push_back(seconds_since(t1));
      t.finish_save();
    }
    std::ifstream log(dir + "/" + m.name + "/saves.jsonl");
    for (std::string line; std::getline(log, line);) {
      const auto j = nlohmann::json::parse(line);
      m.write.push_back(j.at("write_s").get<double>());
      m.bytes = j.at("bytes").get<double>();
    }
  }
  std::printf("model %.1f M parameters, checkpoint %.0f MB, %d saves per mode, in %s\n", params / 1e6,
              modes[1].bytes / 1e6, saves, dir.c_str());
  std::printf("%-13s %8s %14s %9s %11s %9s %11s %9s %11s\n", "mode", "step s", "step w/ save s", "pause s",
              "pause/step", "write s", "write MB/s", "disk MB/s", "write/disk");
  for (const Mode& m : modes) {
    const double quiet = median(m.quiet), step = median(m.step), pause = median(m.pause), write = median(m.write);
    std::vector<double> ratios;
    for (size_t i = 0; i < m.write.size() && i < m.disk.size(); ++i) ratios.push_back(m.bytes / 1e6 / m.write[i] / m.disk[i]);
    std::printf("%-13s %8.3f %14.3f %9.3f %11.2f %9.3f %11.0f %9.0f %11.2f\n", m.name, quiet, step, pause,
                pause / quiet, write, m.bytes / 1e6 / write, median(m.disk), median(ratios));
    std::printf("  per save (disk MB/s, write MB/s):");
    for (size_t i = 0; i < m.write.size() && i < m.disk.size(); ++i)
      std::printf(" (%.0f, %.0f)", m.disk[i], m.bytes / 1e6 / m.write[i]);
    std::printf("\n");
  }
  std::printf("(step: median without a save in flight; step w/ save: the step right after start_save(), during "
              "the background write. pause: the time start_save() held training; synchronous saves write, verify "
              "and commit in it. write: the writer's time for the same, from saves.jsonl; disk: measured just "
              "before each save; write/disk: the median of the saves' ratios)\n");
  fs::remove_all(dir);
  return 0;
}
