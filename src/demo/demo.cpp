#include "demo/demo.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/plot.h"
#include "video/video_decoder.h"
#include "demo/adherence.h"
#include "prepare/caption_embedder.h"
#include "prepare/demo_codec.h"
#include "demo/demo_data.h"
#include "demo/shapes.h"
#include "diffusion/sampler.h"
#include "model/state_dict.h"
#include "parallel/mesh.h"
#include "train/trainer.h"

namespace vidit::demo {

std::vector<at::Tensor> sample_captions(DiT& model, const Config& cfg,
                                        const std::vector<std::string>& captions, uint64_t seed) {
  model->eval();
  const auto& m = cfg.model;
  std::vector<at::Tensor> texts;
  for (const auto& c : captions) texts.push_back(embed_caption(c, m.text_len, m.text_dim));
  at::Tensor text = at::stack(texts);
  at::Tensor null_text = at::zeros({m.text_len, m.text_dim});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor noise = at::randn({int64_t(captions.size()), m.in_channels, cfg.data.latent_frames,
                                cfg.data.latent_height, cfg.data.latent_width}, gen, at::kFloat);
  EulerOptions opt{cfg.sample.steps, cfg.sample.shift, cfg.sample.cfg_scale};
  auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& txt) {
    return model->forward(x, t, txt);
  };
  at::Tensor lat = euler_sample(field, noise, text, null_text, opt);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < lat.size(0); ++i) out.push_back(codec_decode(lat[i], cfg.demo.codec_block));
  model->train();
  return out;
}

namespace {

// A set of (colour, direction) prompts: every shape, samples_per_prompt each.
struct Prompts {
  std::vector<std::string> captions;
  std::vector<std::pair<int, Direction>> want;
};

// held_out: the pairs held out of training; otherwise their mirrors, seen in training.
Prompts demo_prompts(const Config& cfg, bool held) {
  Prompts p;
  for (int c = 0; c < int(palette().size()); ++c)
    for (Direction d : directions())
      if (held ? held_out(c, d) : seen_mirror(c, d))
        for (int s = 0; s < int(shape_names().size()); ++s)
          for (int64_t k = 0; k < cfg.demo.samples_per_prompt; ++k) {
            ClipSpec spec;
            spec.colour = c, spec.shape = s, spec.direction = d;
            p.captions.push_back(caption(spec));
            p.want.emplace_back(c, d);
          }
  return p;
}

// The first sample of each prompt as a TensorBoard image: its frames side by side, 4x upscaled,
// under samples/<caption>, and the adherence of the whole set as a scalar.
void add_samples_to_tensorboard(TensorBoardWriter& tb, int64_t step, const std::vector<std::string>& captions,
                                const std::vector<at::Tensor>& clips, int correct) {
  std::set<std::string> done;
  for (size_t i = 0; i < clips.size(); ++i) {
    if (!done.insert(captions[i]).second) continue;
    const at::Tensor& c = clips[i];  // [T, H, W, 3] uint8
    at::Tensor strip = c.permute({1, 0, 2, 3}).reshape({c.size(1), c.size(0) * c.size(2), 3});
    strip = strip.repeat_interleave(4, 0).repeat_interleave(4, 1).contiguous();
    std::string tag = captions[i];
    std::replace(tag.begin(), tag.end(), ' ', '_');
    tb.add_image("samples/" + tag, step, encode_png(strip.data_ptr<uint8_t>(), int(strip.size(0)), int(strip.size(1)), 3),
                 int(strip.size(0)), int(strip.size(1)), 3);
  }
  tb.add_scalar("demo/held_out_adherence", step, clips.empty() ? 0.0 : double(correct) / double(clips.size()));
  tb.flush();
}

// Samples every prompt of the set and counts the clips that adhere. With `samples_dir`, writes
// each clip as MP4 there and prints one line per clip. With `tb` (held-out prompts), adds the
// samples to TensorBoard at `step`.
std::pair<int, int> check_prompts(DiT& model, const Config& cfg, bool held, const std::string& samples_dir,
                                  TensorBoardWriter* tb = nullptr, int64_t step = 0) {
  const Prompts p = demo_prompts(cfg, held);
  auto clips = sample_captions(model, cfg, p.captions, cfg.sample.seed);
  if (!samples_dir.empty()) std::filesystem::create_directories(samples_dir);
  int correct = 0;
  for (size_t i = 0; i < clips.size(); ++i) {
    ClipAnalysis a = analyse_clip(clips[i]);
    const bool ok = adheres(a, p.want[i].first, p.want[i].second);
    correct += ok;
    if (samples_dir.empty()) continue;
    std::string name = p.captions[i].substr(2);
    std::replace(name.begin(), name.end(), ' ', '_');
    std::string path = samples_dir + "/" + name + "_" + std::to_string(i % cfg.demo.samples_per_prompt) + ".mp4";
    encode_video_mp4(path, clips[i], 8.0, 10, /*upscale=*/4);
    std::printf("[demo]     %-28s -> %-44s %s\n", p.captions[i].c_str(), a.describe().c_str(), ok ? "ok" : "MISS");
  }
  if (tb) add_samples_to_tensorboard(*tb, step, p.captions, clips, correct);
  return {correct, int(clips.size())};
}

// The weights the demo samples with: the EMA when there is one (whole tensors: collective when
// the trainer shards them).
DiT sampling_model(Trainer& trainer, const Config& cfg) {
  DiT model = dit_without_storage(cfg.model, at::kCPU);
  load_state_dict(*model, trainer.sampling_weights(), "trained weights");
  return model;
}

}  // namespace

DemoReport run_demo(const Config& cfg, bool resume, std::shared_ptr<const Mesh> mesh) {
  namespace fs = std::filesystem;
  if (!mesh) mesh = std::make_shared<Mesh>(cfg, make_single_comm());  // this process alone
  const auto t_start = std::chrono::steady_clock::now();
  const std::string out = cfg.train.out_dir;
  // Under mpirun every rank trains; rank 0 prints, samples and checks.
  const bool lead = mesh->rank() == 0;
  fs::create_directories(out);
  DemoReport report;

  if (lead)
    std::printf("[demo] 1/4 making %lld shape videos (H.264 MP4) in %s/videos and caching them\n",
                (long long)cfg.demo.videos, out.c_str());
  std::fflush(stdout);
  // Each rank renders the (deterministic) videos into its own folder and reads its share.
  DemoData data = prepare_demo_data(cfg, lead ? out : out + "/rank" + std::to_string(mesh->rank()),
                                    mesh->coord("dp"), mesh->degree("dp"));
  if (lead) {
    std::printf("[demo] 2/4 decoded with FFmpeg, bucketed, encoded (demo codec, block %lld) into %s: %lld samples, "
                "%lld rejected\n", (long long)cfg.demo.codec_block, data.cache_dir.c_str(),
                (long long)data.report.written, (long long)data.report.rejected);
    for (const auto& [bucket, n] : data.report.per_bucket)
      std::printf("[demo]     bucket %-10s %4lld clips\n", bucket.c_str(), (long long)n);
    std::printf("[demo]     loader: %lld tokens per batch%s\n", (long long)data.loader->token_budget(),
                mesh->size() > 1 ? " per data-parallel rank" : "");
    std::printf("[demo] 3/4 training the DiT (%lld steps)\n", (long long)cfg.train.steps);
  }
  std::fflush(stdout);
  Trainer trainer(cfg, data.loader, at::zeros({cfg.model.text_len, cfg.model.text_dim}), at::kCPU, mesh);
  if (resume && trainer.resume() && lead)
    std::printf("[demo]     resumed at step %lld\n", (long long)trainer.steps_done());
  double eval_seconds = 0;
  auto periodic_check = [&](const StepResult& r) {
    if (cfg.demo.eval_every <= 0 || r.step % cfg.demo.eval_every != 0 || r.step == cfg.train.steps) return;
    const auto t0 = std::chrono::steady_clock::now();
    DiT model = sampling_model(trainer, cfg);
    if (!lead) return;
    auto [ok, n] = check_prompts(model, cfg, true, "", trainer.tensorboard(), r.step);
    eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[demo]     step %lld: held-out adherence %d/%d = %.1f%%\n", (long long)r.step, ok, n, 100.0 * ok / n);
    std::fflush(stdout);
  };
  const auto t_train = std::chrono::steady_clock::now();
  report.losses = trainer.fit(-1, true, periodic_check);
  report.train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_train).count() - eval_seconds;
  DiT model = sampling_model(trainer, cfg);
  if (!lead) {
    // The lead's verdict, so every rank exits with the same status.
    at::Tensor result = at::zeros({2}, at::kLong);
    mesh->world()->broadcast(result, 0)->wait();
    report.correct = int(result[0].item<int64_t>()), report.total = int(result[1].item<int64_t>());
    return report;
  }
  write_loss_curve_png(out + "/loss.png", report.losses);

  std::printf("[demo] 4/4 sampling %lld clips for prompts held out of training (%lld Euler steps, cfg %.1f)\n",
              (long long)(demo_prompts(cfg, true).captions.size()), (long long)cfg.sample.steps, cfg.sample.cfg_scale);
  std::fflush(stdout);
  std::tie(report.correct, report.total) =
      check_prompts(model, cfg, true, out + "/samples", trainer.tensorboard(), trainer.steps_done());
  // The mirrored pairs seen in training, for comparison: a gap between the two is a failure to
  // generalise, not to fit.
  auto [seen_ok, seen_n] = check_prompts(model, cfg, false, "");
  at::Tensor result = at::tensor({int64_t(report.correct), int64_t(report.total)}, at::kLong);
  mesh->world()->broadcast(result, 0)->wait();
  report.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("[demo] prompt adherence on held-out prompts: %d/%d = %.1f%% (target >= 90%%)\n", report.correct,
              report.total, 100.0 * report.adherence());
  std::printf("[demo] (the mirrored pairs seen in training: %d/%d = %.1f%%)\n", seen_ok, seen_n, 100.0 * seen_ok / seen_n);
  std::printf("[demo] final loss %.4f; training %.0f s; whole demo %.0f s\n",
              report.losses.empty() ? 0.0 : report.losses.back(), report.train_seconds, report.total_seconds);
  std::printf("[demo] outputs: %s/samples/*.mp4, %s/loss.png, %s/metrics.jsonl, %s/checkpoints/\n",
              out.c_str(), out.c_str(), out.c_str(), out.c_str());
  return report;
}

}  // namespace vidit::demo
