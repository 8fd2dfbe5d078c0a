#include "parallel/activation_memory.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/precision.h"
#include "diffusion/frame_condition.h"
#include "model/dit.h"
#include "model/fp8.h"

namespace vidit {

BlockActivations measure_block_activations(const Config& cfg, const at::Device& device) {
  const ModelConfig& m = cfg.model;
  // The measuring models draw from the default CPU generator; the run's stream is put back.
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = gen.get_state();
  struct Restore {
    at::Generator& gen;
    const at::Tensor& state;
    ~Restore() { gen.set_state(state); }
  } restore{gen, rng_state};
  auto held_now = [&] {
    return device.is_cuda() ? cuda_allocated_bytes(device.has_index() ? device.index() : 0) : host_heap_bytes();
  };
  // Models of one and of two blocks, their weights as the run's (FP8 layers included).
  std::vector<DiT> models;
  for (int64_t layers : {1, 2}) {
    ModelConfig c = m;
    c.layers = layers;
    DiT model(c);
    model->init_weights();
    model->to(device);
    // With the run's reused casts (kept across the forwards: the weights' casts are the plan's
    // weights, not the block's activations).
    apply_fp8(*model, cfg.train.precision, cfg.train.fp8_fast_accum,
              cfg.train.fp8_reuse_casts ? std::make_shared<Fp8Casts>(/*weights=*/true) : nullptr);
    models.push_back(model);
  }
  // `samples` samples of `tokens` tokens: one patch of frames, 16 rows of patches.
  auto held = [&](DiT& model, int64_t tokens, int64_t whole, int64_t selective, int64_t samples = 1) {
    const at::Tensor x =
        at::randn({samples, m.in_channels, m.patch[0], 16 * m.patch[1], tokens / 16 * m.patch[2]}).to(device);
    // A model that keeps its first frame (Wan 2.2 TI2V) takes a timestep per token: its per-token
    // modulation is part of what a block holds.
    const at::Tensor t = (fuses_first_frame(m) ? at::full({samples, tokens}, 500.0) : at::full({samples}, 500.0)).to(device),
                     text = at::randn({samples, m.text_len, m.text_dim}).to(device);
    model->recompute_blocks = whole;
    model->selective_blocks = selective;
    const int64_t before = held_now();
    AutocastGuard autocast(cfg.train.precision, device.type());
    at::Tensor out = model->forward(x, t, text);
    return double(held_now() - before);  // `out` (and the graph it holds) is freed on return
  };
  // Three token counts, multiples of 16, h apart: a quadratic through the three. A first
  // forward of each shape builds state that stays (autocast's, the CPU kernels' primitive
  // caches): not the block's.
  constexpr int64_t L1 = 256, h = 256;
  for (DiT& model : models) {
    for (int i = 0; i < 3; ++i) held(model, L1 + i * h, 0, 0);
    held(model, L1, 0, 0, 2);
  }
  auto line = [&](int64_t whole, int64_t selective) {
    auto block = [&](int64_t tokens, int64_t samples) {
      return held(models[1], tokens, whole, selective, samples) - held(models[0], tokens, whole, selective, samples);
    };
    const double f0 = block(L1, 1), f1 = block(L1 + h, 1), f2 = block(L1 + 2 * h, 1), two = block(L1, 2);
    BlockActivations::Line l;
    l.per_pair = std::max(0.0, (f2 - 2 * f1 + f0) / (2.0 * h * h));
    l.per_token = std::max(0.0, (f1 - f0) / double(h) - l.per_pair * double(2 * L1 + h));
    // One more sample adds its own part: per_sample + per_token L + per_pair L^2.
    const double sample = two - f0;
    l.per_sample = std::max(0.0, sample - l.per_token * double(L1) - l.per_pair * double(L1 * L1));
    l.per_forward = std::max(0.0, f0 - sample);
    return l;
  };
  BlockActivations a;
  a.keep = line(0, 0);
  a.selective = line(0, -1);
  a.whole = line(-1, 0);
  a.source = "measured on " + device.str() + " (" + name_of(cfg.train.precision) + ")";
  for (auto* l : {&a.keep, &a.selective, &a.whole})
    VIDIT_CHECK(l->per_token > 0, "measuring a block's activations on ", device.str(),
                ": the allocator reported no memory held (", l->per_token, " bytes per token)");
  return a;
}

}  // namespace vidit
