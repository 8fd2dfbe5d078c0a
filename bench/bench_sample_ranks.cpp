// The denoise phase of `vidit sample` (pipeline/wan_pipeline.h denoise_latents) timed on this
// process's share of a sampling job (pipeline/sampling_ranks.h): run it as one process with T
// threads and under mpirun with N ranks of T/N threads each, on the same model and request
// (bench/bench_sample_ranks.sh does both, side by side). A DiT of Wan's head width (128) with
// random weights (the same seed on every rank), random prompt contexts, the sampler and guidance
// of the config's defaults (UniPC here). Rank 0 prints one line: ranks, threads, layout, tokens,
// the phase's seconds, and a checksum of the latents (equal between the runs up to rounding).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "model/dit.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "pipeline/sampling_ranks.h"
#include "pipeline/wan_pipeline.h"

using namespace vidit;

int main(int argc, char** argv) {
  CLI::App app("denoise phase on this process's share of a sampling job");
  int threads = 1, steps = 4, layers = 4, frames = 17, width = 320, height = 256;
  int64_t dim = 512;
  std::vector<std::string> sets;
  app.add_option("--threads", threads, "ATen threads of this process");
  app.add_option("--steps", steps, "solver steps");
  app.add_option("--layers", layers, "DiT blocks");
  app.add_option("--dim", dim, "DiT width (heads = dim / 128)");
  app.add_option("--frames", frames, "video frames (1 + 4k)");
  app.add_option("--width", width, "video width");
  app.add_option("--height", height, "video height");
  app.add_option("--set", sets, "config overrides (sample.cfg_parallel=false, parallel.ulysses=2, ...)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  try {
    std::vector<std::string> all = {"sample.solver=\"unipc\"", "sample.cfg_scale=5.0",
                                    "sample.steps=" + std::to_string(steps)};
    all.insert(all.end(), sets.begin(), sets.end());
    Config cfg = parse_config("", "<bench>", all);
    ModelConfig& m = cfg.model;
    m.dim = dim, m.heads = dim / 128, m.ffn_dim = 4 * dim, m.layers = layers, m.in_channels = 16, m.out_channels = 16;
    m.patch = {1, 2, 2}, m.text_dim = 512, m.text_len = 512, m.freq_dim = 256;
    VideoRequest req;
    req.frames = frames, req.width = width, req.height = height, req.seed = 3;
    check_video_request(req, m);
    const std::vector<int64_t> shape = latent_shape(req, m);
    const int64_t tokens = shape[2] * (shape[3] / 2) * (shape[4] / 2);

    const SamplingRanks ranks = make_sampling_ranks(cfg, shape, make_world_comm(detect_launch_env()));
    torch::manual_seed(7);
    DiT model(m);
    model->init_weights();
    for (auto& p : model->parameters()) p.data().normal_(0, 0.02);
    const TensorMap whole = state_dict(*model);
    model = nullptr;
    const at::Tensor context = at::randn({1, m.text_len, m.text_dim}, at::make_generator<at::CPUGeneratorImpl>(1));
    const at::Tensor negative = at::randn({1, m.text_len, m.text_dim}, at::make_generator<at::CPUGeneratorImpl>(2));
    const at::Tensor noise = at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(3));

    ranks.world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor lat = denoise_latents(cfg, whole, "<random>", context, negative, noise, at::kCPU, &ranks);
    ranks.world->barrier();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ranks.lead())
      std::printf("denoise: %d rank(s) x %d thread(s) [%s], %lld tokens, head width %lld, %d blocks, %d steps: "
                  "%.2f s; latents sum |x| %.6f\n",
                  ranks.size(), threads, ranks.describe().c_str(), (long long)tokens, (long long)(dim / m.heads),
                  layers, steps, s, lat.abs().sum().item<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sample_ranks: %s\n", e.what());
    abort_world(2);
    return 2;
  }
  return 0;
}
