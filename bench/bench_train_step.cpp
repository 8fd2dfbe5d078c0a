// Times training steps (forward, backward, clip, AdamW, EMA) of a config on synthetic latents
// and prints step time, tokens/s and achieved GFLOP/s (FLOPs from model_info.h).
//   bench_train_step [--config F] [--set k=v ...] [--steps N] [--warmup N] [--device cpu|cuda]
//                    [--dump DIR [--dump-steps N]]  (for bench/torch_reference.py and
//                                   tests/reference/gradient_reference.py: every weight perturbed
//                                   by 0.05 x N(0, 1) so no zero-initialised tensor stops a
//                                   gradient, then DIR/weights.safetensors (official names),
//                                   DIR/transformer/ (diffusers' layout), one forward's inputs and
//                                   output (one process), and for each of the first N steps
//                                   DIR/step_<n>.safetensors: the global batch of every micro-
//                                   batch (micro<m>/x_t, timestep, text, target, loss), the step's
//                                   loss and every parameter's whole gradient before clipping
//                                   (grad/<diffusers name>))
//                    [--system-malloc] (skip keep_freed_memory(), for the A/B in BENCHMARKS.md)
//                    [--profile FILE] (chrome trace of the timed steps; bench/profile_summary.py
//                                      totals it by op)
// Under mpirun or torchrun it trains on the mesh of the config's [parallel] section and also
// reports the median time rank 0 was blocked in collectives per step (parallel/timed_comm.h): the
// communication compute did not hide (bench/bench_overlap.sh compares FSDP prefetch on / off).
#include <ATen/CPUGeneratorImpl.h>
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
#include "model/weight_layout.h"
#include "train/step_tap.h"
#include "train/trainer.h"

using namespace vidit;

// The process's peak resident memory (getrusage), MB.
static double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

// Writes the first `steps` steps' global batches, losses and whole gradients (see the header).
// Every rank makes the same gathers; rank 0 writes.
class DumpTap : public StepTap {
 public:
  DumpTap(std::string dir, int64_t steps, const Mesh& mesh) : dir_(std::move(dir)), steps_(steps), mesh_(mesh) {}
  void micro_batch(int64_t step, int64_t micro, const at::Tensor& x_t, const at::Tensor& timestep,
                   const at::Tensor& text, const at::Tensor& target, const at::Tensor& loss) override {
    if (step > steps_) return;
    const std::string m = "micro" + std::to_string(micro) + "/";
    out_[m + "x_t"] = rows(x_t), out_[m + "timestep"] = rows(timestep), out_[m + "text"] = rows(text);
    out_[m + "target"] = rows(target);
    at::Tensor l = loss.detach().to(at::kDouble).cpu().reshape({1}).contiguous();
    const auto& dp = mesh_.group("dp");
    at::Tensor all = at::empty({dp->size()}, l.options());
    dp->all_gather(l, all)->wait();
    out_[m + "loss"] = all.mean().to(at::kFloat);  // the ranks' rows are equal in number here
  }
  void before_clip(int64_t step, double loss, const ParallelModel& model) override {
    if (step > steps_) return;
    TensorMap grads;
    for (const auto& [name, p] : model.params())
      if (p.grad().defined()) grads[name] = p.grad();
    TensorMap whole = model.whole(grads);
    if (mesh_.rank() == 0) {
      for (auto& [name, g] : whole) out_["grad/" + diffusers_name(name)] = g.to(at::kFloat).cpu().contiguous();
      out_["loss"] = at::tensor({float(loss)});
      char name[64];
      std::snprintf(name, sizeof name, "/step_%06lld.safetensors", (long long)step);
      save_safetensors(dir_ + name, out_);
    }
    out_.clear();
  }

 private:
  // This micro-batch's rows of every data-parallel rank, in rank order (equal row counts).
  at::Tensor rows(const at::Tensor& t) const {
    const at::Tensor in = t.detach().to(at::kFloat).contiguous();
    const auto& dp = mesh_.group("dp");
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] *= dp->size();
    at::Tensor out = at::empty(shape, in.options());
    dp->all_gather(in, out)->wait();
    return out.cpu().contiguous();
  }
  std::string dir_;
  int64_t steps_;
  const Mesh& mesh_;
  TensorMap out_;
};

// Adds 0.05 x N(0, 1) to every weight, drawn whole (the same values at any mesh) and copied into
// this rank's part (not collective).
static void perturb_weights(Trainer& trainer, uint64_t seed) {
  at::NoGradGuard ng;
  const ParallelModel& pm = trainer.parallel_model();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, shape] : pm.whole_shapes()) {
    at::Tensor p = pm.params().at(name);
    at::Tensor noise = 0.05 * at::randn(shape.sizes(), gen, at::kFloat);
    p.add_(pm.local(name, noise).to(p.device(), p.scalar_type()));
  }
}

int main(int argc, char** argv) {
  CLI::App app{"time vidit training steps"};
  std::string config, device = "cpu", dump, profile;
  std::vector<std::string> sets;
  int steps = 20, warmup = 3, dump_steps = 1;
  app.add_option("-c,--config", config);
  app.add_option("--set", sets);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--device", device);
  app.add_option("--dump", dump, "write weights, one forward pass and the first steps for the PyTorch references");
  app.add_option("--dump-steps", dump_steps, "steps whose batches, losses and gradients --dump writes")
      ->check(CLI::PositiveNumber);
  app.add_option("--profile", profile, "write a chrome trace of the timed steps to this file");
  bool system_malloc = false;
  app.add_flag("--system-malloc", system_malloc, "leave glibc's malloc settings as they are");
  CLI11_PARSE(app, argc, argv);
  if (!system_malloc) keep_freed_memory();
  try {
    // No saves, so no snapshot buffers (checkpoint.snapshots): at Wan 14B's width they would be
    // tens of GB of pinned host memory taken for nothing.
    sets.insert(sets.begin(), {"data.source=synthetic", "train.out_dir=\"/tmp/vidit_bench\"",
                               "checkpoint.every=0", "train.ema_decay=0", "checkpoint.snapshots=0"});
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
      perturb_weights(trainer, cfg.train.seed + 99);
      const TensorMap weights = trainer.weights();  // collective
      if (lead) {
        save_safetensors(dump + "/weights.safetensors", weights);
        try {  // (not every config has a diffusers equivalent, e.g. the demo's rope_theta)
          write_diffusers_transformer(weights, cfg.model, dump + "/transformer");
        } catch (const Error& e) {
          std::printf("no %s/transformer: %s\n", dump.c_str(), e.what());
        }
      }
      if (env.world == 1) {
        auto [x, text] = data->batch({0, 1});
        at::Tensor t = at::tensor({250.0f, 800.0f});
        at::Tensor out;
        {
          at::NoGradGuard ng;
          out = trainer.model()->forward(x.to(dev), t.to(dev), text.to(dev)).cpu();
        }
        save_safetensors(dump + "/forward.safetensors", {{"x", x}, {"t", t}, {"text", text}, {"out", out}});
      }
      trainer.set_step_tap(std::make_shared<DumpTap>(dump, dump_steps, trainer.mesh()));
      if (lead)
        std::ofstream(dump + "/config.json") << nlohmann::json{
            {"dim", cfg.model.dim}, {"ffn_dim", cfg.model.ffn_dim}, {"heads", cfg.model.heads},
            {"layers", cfg.model.layers}, {"in_channels", cfg.model.in_channels},
            {"out_channels", cfg.model.out_channels}, {"patch", cfg.model.patch},
            {"text_dim", cfg.model.text_dim}, {"text_len", cfg.model.text_len},
            {"freq_dim", cfg.model.freq_dim}, {"eps", cfg.model.eps}, {"rope_theta", cfg.model.rope_theta},
            {"batch_size", cfg.train.batch_size}, {"latent", {cfg.data.latent_frames, cfg.data.latent_height,
                                                             cfg.data.latent_width}},
            {"lr", cfg.train.lr}, {"threads", at::get_num_threads()}, {"world", env.world},
            {"dumped_steps", dump_steps}, {"grad_accum", cfg.train.grad_accum},
            {"warmup_steps", cfg.train.warmup_steps}, {"schedule", cfg.train.schedule == Schedule::constant ? "constant" : "cosine"},
            {"weight_decay", cfg.train.weight_decay}, {"beta1", cfg.train.beta1}, {"beta2", cfg.train.beta2},
            {"adam_eps", cfg.train.adam_eps}, {"grad_clip", cfg.train.grad_clip}}.dump(2);
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
