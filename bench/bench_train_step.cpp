// Times training steps (forward, backward, clip, AdamW, EMA) of a config on synthetic latents
// and prints step time, tokens/s and achieved GFLOP/s (FLOPs from model_info.h).
//   bench_train_step [--config F] [--set k=v ...] [--steps N] [--warmup N] [--device cpu|cuda]
//                    [--dump DIR]   (weights + one forward's inputs/outputs for torch_reference.py)
//                    [--system-malloc] (skip keep_freed_memory(), for the A/B in BENCHMARKS.md)
//                    [--profile FILE] (chrome trace of the timed steps; bench/profile_summary.py
//                                      totals it by op)
// Under mpirun or torchrun it trains on the mesh of the config's [parallel] section and also
// reports the median time rank 0 was blocked in collectives per step (parallel/timed_comm.h): the
// communication compute did not hide (bench/bench_overlap.sh compares FSDP prefetch on / off).
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/gpu_events.h"
#include "core/malloc_tuning.h"
#include "core/safetensors.h"
#include "loader/dataset.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "model/model_info.h"
#include "model/state_dict.h"
#include "train/trainer.h"

using namespace vidit;

// The process's peak resident memory (getrusage), MB.
static double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

int main(int argc, char** argv) {
  CLI::App app{"time vidit training steps"};
  std::string config, device = "cpu", dump, profile;
  std::vector<std::string> sets;
  int steps = 20, warmup = 3;
  app.add_option("-c,--config", config);
  app.add_option("--set", sets);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--device", device);
  app.add_option("--dump", dump, "write weights and one forward pass for the PyTorch reference");
  app.add_option("--profile", profile, "write a chrome trace of the timed steps to this file");
  bool system_malloc = false;
  app.add_flag("--system-malloc", system_malloc, "leave glibc's malloc settings as they are");
  CLI11_PARSE(app, argc, argv);
  if (!system_malloc) keep_freed_memory();
  try {
    // No saves, so no snapshot buffers (train.ckpt_snapshots): at Wan 14B's width they would be
    // tens of GB of pinned host memory taken for nothing.
    sets.insert(sets.begin(), {"data.source=synthetic", "train.out_dir=\"/tmp/vidit_bench\"",
                               "train.ckpt_every=0", "train.ema_decay=0", "train.ckpt_snapshots=0"});
    Config cfg = load_config(config, sets);
    cfg.train.steps = warmup + steps;
    const LaunchEnv env = detect_launch_env();
    // Under torchrun each process takes its local rank's GPU (and makes it current).
    at::Device dev(at::kCPU);
    if (device == "cuda") {
      const int gpu = process_gpu(env, int(torch::cuda::device_count()));
      use_gpu(gpu);
      dev = at::Device(at::kCUDA, int8_t(gpu));
    }
    auto data = std::make_shared<SyntheticDataset>(cfg, 4096, cfg.train.seed);
    std::shared_ptr<const Mesh> mesh;
    if (env.world > 1) mesh = std::make_shared<Mesh>(cfg, make_world_comm(env, dev.type()));
    const bool lead = env.rank == 0;
    Trainer trainer(cfg, data, at::zeros({cfg.model.text_len, cfg.model.text_dim}), dev, mesh);
    ModelInfo info = model_info(cfg);

    if (!dump.empty()) {
      std::filesystem::create_directories(dump);
      {
        // The head starts at zero (Wan's init); give it weights so the compared output is not flat.
        at::NoGradGuard ng;
        at::manual_seed(cfg.train.seed + 99);
        trainer.model()->head->head->weight.normal_(0.0, 0.05);
      }
      save_safetensors(dump + "/weights.safetensors", state_dict(*trainer.model()));
      auto [x, text] = data->batch({0, 1});
      at::Tensor t = at::tensor({250.0f, 800.0f});
      at::Tensor out;
      {
        at::NoGradGuard ng;
        out = trainer.model()->forward(x.to(dev), t.to(dev), text.to(dev)).cpu();
      }
      save_safetensors(dump + "/forward.safetensors", {{"x", x}, {"t", t}, {"text", text}, {"out", out}});
      std::ofstream(dump + "/config.json") << nlohmann::json{
          {"dim", cfg.model.dim}, {"ffn_dim", cfg.model.ffn_dim}, {"heads", cfg.model.heads},
          {"layers", cfg.model.layers}, {"in_channels", cfg.model.in_channels},
          {"out_channels", cfg.model.out_channels}, {"patch", cfg.model.patch},
          {"text_dim", cfg.model.text_dim}, {"text_len", cfg.model.text_len},
          {"freq_dim", cfg.model.freq_dim}, {"eps", cfg.model.eps}, {"rope_theta", cfg.model.rope_theta},
          {"batch_size", cfg.train.batch_size}, {"latent", {cfg.data.latent_frames, cfg.data.latent_height,
                                                           cfg.data.latent_width}},
          {"lr", cfg.train.lr}, {"threads", at::get_num_threads()}}.dump(2);
    }

    std::vector<double> times, waits;
    double loss_sum = 0;  // over every step, warm-up included: the FP8 / bf16 loss gap
    for (int i = 0; i < warmup; ++i) loss_sum += trainer.step().loss;
    // What FSDP puts into its weight all-gathers (parallel.gather_dtype, parallel.fp8_all_gather).
    const auto* fsdp = trainer.parallel_model().find<FullyShardedDataParallel>();
    const int64_t gathered_before = fsdp ? fsdp->gather_sent_bytes() : 0;
    const int gpu = dev.is_cuda() ? std::max<int>(0, dev.index()) : -1;
    if (gpu >= 0) cuda_reset_peak_memory(gpu);
    {
      std::unique_ptr<torch::autograd::profiler::RecordProfile> prof;
      if (!profile.empty()) prof = std::make_unique<torch::autograd::profiler::RecordProfile>(profile);
      for (int i = 0; i < steps; ++i) {
        StepResult r = trainer.step();
        loss_sum += r.loss;
        times.push_back(r.seconds);
        waits.push_back(r.comm_wait_s);
      }
    }
    const double gather_mb = fsdp ? double(fsdp->gather_sent_bytes() - gathered_before) / steps / 1e6 : 0.0;
    if (!lead) return 0;
    std::sort(times.begin(), times.end());
    std::sort(waits.begin(), waits.end());
    const double med = times[times.size() / 2], wait = waits[waits.size() / 2];
    const double samples = double(cfg.train.batch_size * cfg.train.grad_accum);
    std::printf("config %s, device %s, threads %d, batch %lld, %lld tokens/sample, %lld params\n",
                cfg.source.c_str(), device.c_str(), at::get_num_threads(), (long long)cfg.train.batch_size,
                (long long)info.tokens, (long long)info.params);
    std::printf("step time median %.4f s (min %.4f, max %.4f over %d steps)\n", med, times.front(), times.back(), steps);
    if (mesh)
      std::printf("%d ranks (%s): rank 0 blocked in collectives %.4f s per step (median), %.1f%% of the step\n",
                  env.world, mesh->world()->backend().c_str(), wait, 100.0 * wait / med);
    std::printf("peak resident memory %.1f MB\n", peak_rss_mb());
    const double gpu_peak_gb = gpu >= 0 ? double(cuda_peak_allocated_bytes(gpu)) / 1e9 : 0.0;
    if (gpu >= 0) std::printf("peak GPU memory allocated %.2f GB\n", gpu_peak_gb);
    std::printf("tokens/s %.0f | samples/s %.2f | achieved %.3f GFLOP/s\n", samples * info.tokens / med,
                samples / med, samples * info.train_flops / med / 1e9);
    std::printf("%s\n", nlohmann::json{{"step_time_s", med}, {"gflops", samples * info.train_flops / med / 1e9},
                                       {"tokens_per_s", samples * info.tokens / med},
                                       {"ranks", env.world}, {"comm_wait_s", mesh ? wait : 0.0},
                                       {"peak_rss_mb", peak_rss_mb()},
                                       {"mean_loss", loss_sum / (warmup + steps)},
                                       {"gpu_peak_gb", gpu_peak_gb},
                                       {"gather_mb_per_step", gather_mb}}.dump().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
