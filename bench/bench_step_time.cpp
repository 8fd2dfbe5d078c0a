// The step-time model (parallel/step_time.h) against measured steps, side by side in one run:
// for each config, the rates of this machine are measured (measure_rates, as `vidit plan
// --measure` does), the step time predicted, and then the trainer runs the same config for a
// few steps (one process); the table gives measured / predicted.
//   bench_step_time [--device cpu|cuda] [--steps N] [--threads T]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/malloc_tuning.h"
#include "loader/dataset.h"
#include "parallel/plan.h"
#include "parallel/step_time.h"
#include "train/trainer.h"

using namespace vidit;

int main(int argc, char** argv) {
  keep_freed_memory();
  CLI::App app{"step-time model: predicted against measured steps"};
  std::string device = "cpu";
  int steps = 5, threads = 2;
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--steps", steps, "measured steps per config (after one warm-up step)");
  app.add_option("--threads", threads, "train.threads on the CPU");
  CLI11_PARSE(app, argc, argv);
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  // From matmul-bound (wide, few tokens) to attention-heavy (narrow, many tokens).
  const std::vector<Case> cases = {
      {"wide", {"model.dim=1024", "model.ffn_dim=4096", "model.heads=16", "model.layers=4", "data.latent_frames=2",
                "data.latent_height=16", "data.latent_width=16", "train.batch_size=2"}},
      {"middle", {"model.dim=512", "model.ffn_dim=2048", "model.heads=8", "model.layers=4", "data.latent_frames=4",
                  "data.latent_height=16", "data.latent_width=16", "train.batch_size=2"}},
      {"long", {"model.dim=256", "model.ffn_dim=1024", "model.heads=4", "model.layers=4", "data.latent_frames=8",
                "data.latent_height=32", "data.latent_width=32", "train.batch_size=1"}},
  };
  const std::string dir = "/tmp/vidit-bench-step-time";
  std::printf("%-7s %7s %11s %11s %11s %11s %11s %11s %9s\n", "config", "tokens", "matmul s", "attention s",
              "elementw s", "predicted s", "measured s", "measured/p", "MFU pred");
  for (const Case& c : cases) {
    std::vector<std::string> sets = c.sets;
    for (const char* s : {"data.source=\"synthetic\"", "model.text_dim=64", "model.text_len=8", "train.log_every=1000",
                          "train.steps=1000", "checkpoint.every=0", "checkpoint.snapshots=0"})
      sets.push_back(s);
    sets.push_back("train.threads=" + std::to_string(threads));
    sets.push_back(std::string("train.device=\"") + device + "\"");
    if (device == "cuda") sets.push_back("train.precision=\"bf16\"");
    sets.push_back("train.out_dir=\"" + dir + "/" + c.name + "\"");
    std::filesystem::remove_all(dir + "/" + c.name);
    const Config cfg = parse_config("", "<bench>", sets);
    const DeviceRates rates = measure_rates(cfg, device);
    const StepTimePrediction p = predict_step_time(cfg, plan_step(cfg), rates);
    Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 64, 1), at::zeros({cfg.model.text_len, cfg.model.text_dim}),
              device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
    t.step();  // warm-up
    std::vector<double> secs;
    for (int i = 0; i < steps; ++i) secs.push_back(t.step().seconds);
    std::sort(secs.begin(), secs.end());
    const double measured = secs[secs.size() / 2];
    std::printf("%-7s %7lld %11.4f %11.4f %11.4f %11.4f %11.4f %11.2f %8.1f%%\n", c.name,
                (long long)tokens_per_sample(cfg), p.matmul_s, p.attention_s, p.elementwise_s, p.serial_s(), measured,
                measured / p.serial_s(), 100 * p.mfu(p.serial_s(), rates.peak_flops));
  }
  std::printf("(one process; rates measured on this device first; measured: the median of %d steps)\n", steps);
  std::filesystem::remove_all(dir);
  return 0;
}
