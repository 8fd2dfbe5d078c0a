// Wan 2.2 TI2V-5B's form: a 48-channel transformer (here 8, the small VAE's) on the Wan 2.2 VAE,
// which diffusers runs with expand_timesteps, a timestep per token.
//  - Text-to-video: every token's timestep is the step's, so vidit's one timestep per sample gives
//    diffusers' latents, and the Wan 2.2 VAE decodes them as the pipeline does.
//  - Image-to-video: the picture's latent kept as the first latent frame, its tokens at timestep 0,
//    equal to diffusers' WanImageToVideoPipeline with expand_timesteps.
//  - The DiT's timestep per token: all equal is the per-sample forward.
//  - Training keeps each clip's first latent frame clean at timestep 0 and learns on the rest.
// The VAE's stride (16) and its latent channels are checked against the transformer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/safetensors.h"
#include "diffusion/frame_condition.h"
#include "loader/cache_loader.h"
#include "model/dit.h"
#include "parallel/activation_memory.h"
#include "pipeline/image_condition.h"
#include "train/trainer.h"
#include "loader/latent_cache.h"
#include "video/video_test_util.h"
#include "model/weight_layout.h"
#include "pipeline/release_sampling.h"
#include "pipeline/wan_pipeline.h"
#include "train/run_weights.h"
#include "vae/wan22_vae.h"

namespace vidit {
namespace {

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// The reference's release in `release` (with `image`: for image-to-video), opened as vidit sample
// opens it, and the sampling config both parity tests use; `made` says whether the reference ran
// (status 3: diffusers missing).
struct Reference {
  test::ProcessResult made;
  WanWeights w;
  Config cfg;
};
Reference make_reference(const std::string& release, const std::string& image = "") {
  Reference r;
  r.made = test::run_process(test::python() + " " + test::reference_script("diffusers_ti2v_reference.py") + " " +
                             release + (image.empty() ? "" : " " + image) + " 2>&1");
  if (r.made.status != 0) return r;
  r.w.fill_from(release);
  r.cfg = parse_config("", "<test>", {"sample.steps=6", "sample.shift=5.0", "sample.solver=\"unipc\"",
                                      "sample.cfg_scale=5.0"});
  r.cfg.model = read_transformer_config(r.w.transformer);
  return r;
}

TEST(Ti2v, TextToVideoEqualsDiffusersWithExpandTimesteps) {
  test::ScratchDir dir("ti2v_parity");
  const std::string release = dir / "release";
  Reference ref = make_reference(release);
  if (ref.made.status == 3) GTEST_SKIP() << ref.made.output;
  ASSERT_EQ(ref.made.status, 0) << ref.made.output;
  const WanWeights& w = ref.w;
  Config& cfg = ref.cfg;
  EXPECT_EQ(cfg.model.out_channels, 8);
  EXPECT_TRUE(is_wan22_vae(w.vae));
  EXPECT_EQ(vae_stride(w, cfg.model), 16);
  // The release's scheduler gives UniPC with shift 5.
  const ReleaseSampling rs = release_sampling(release, cfg.model, 96 * 64);
  EXPECT_EQ(rs.solver, Solver::unipc);
  EXPECT_EQ(rs.shift, 5.0);
  EXPECT_EQ(rs.model, "Wan 2.2 TI2V-5B text-to-video");  // model_index.json's expand_timesteps
  EXPECT_EQ(rs.fps, 24.0);

  const TensorMap io = load_safetensors(release + "/io.safetensors");
  VideoRequest r;
  r.frames = 9, r.width = 96, r.height = 64;
  EXPECT_EQ(latent_shape(r, cfg.model, 16), io.at("noise").sizes().vec());
  const at::Tensor ours = denoise_latents(cfg, read_transformer_weights(w.transformer), w.transformer, io.at("prompt"),
                                          io.at("negative"), io.at("noise"), at::kCPU, nullptr, false);
  const double err = relative(ours, io.at("latents"));
  std::printf("TI2V-5B form, text-to-video: latents within %.2e of max\n", err);
  EXPECT_LT(err, 1e-5);
  at::NoGradGuard ng;
  const at::Tensor video = open_wan22_vae(w.vae)->decode_latents(ours);
  ASSERT_EQ(video.sizes(), io.at("video").sizes());
  const double verr = relative(video, io.at("video").clamp(-1, 1));
  std::printf("TI2V-5B form, decoded video within %.2e of max\n", verr);
  EXPECT_LT(verr, 1e-4);

  // The Wan 2.2 VAE with a transformer of other channels, and a 48-channel transformer without
  // it, are refused naming the VAE.
  ModelConfig wrong = cfg.model;
  wrong.in_channels = wrong.out_channels = 16;
  const std::string a = test::message_of([&] { vae_stride(w, wrong); });
  EXPECT_NE(a.find("Wan 2.2 VAE of 8 latent channels but the transformer denoises 16"), std::string::npos) << a;
  WanWeights other = w;
  other.vae = dir / "nowhere";
  wrong.in_channels = wrong.out_channels = 48;
  const std::string b = test::message_of([&] { vae_stride(other, wrong); });
  EXPECT_NE(b.find("is not the Wan 2.2 VAE"), std::string::npos) << b;
}

TEST(Ti2v, ImageToVideoEqualsDiffusersWithExpandTimesteps) {
  test::ScratchDir dir("ti2v_i2v_parity");
  const std::string png = dir / "first.png", release = dir / "release";
  ASSERT_TRUE(video_test::ffmpeg("-f lavfi -i testsrc2=size=80x60 -frames:v 1 " + png));  // resized to 96x64
  Reference ref = make_reference(release, png);
  if (ref.made.status == 3) GTEST_SKIP() << ref.made.output;
  ASSERT_EQ(ref.made.status, 0) << ref.made.output;
  const WanWeights& w = ref.w;
  Config& cfg = ref.cfg;
  cfg.model.condition = FrameCondition::first_frame;  // what vidit sample --image sets for this release
  ASSERT_TRUE(fuses_first_frame(cfg.model));
  EXPECT_EQ(vae_stride(w, cfg.model), 16);
  EXPECT_EQ(release_sampling(release, cfg.model, 96 * 64).model, "Wan 2.2 TI2V-5B image-to-video");
  VideoRequest r;
  r.frames = 9, r.width = 96, r.height = 64, r.image = png;
  const ImageCondition condition = make_image_condition(cfg, w, r, at::kCPU);
  ASSERT_TRUE(condition.first.defined());
  EXPECT_FALSE(condition.frames.defined());
  EXPECT_EQ(condition.first.sizes(), (std::vector<int64_t>{1, 8, 1, 4, 6}));
  const TensorMap io = load_safetensors(release + "/io.safetensors");
  const at::Tensor ours = denoise_latents(cfg, read_transformer_weights(w.transformer), w.transformer, io.at("prompt"),
                                          io.at("negative"), io.at("noise"), at::kCPU, nullptr, false, condition);
  const double err = relative(ours, io.at("latents"));
  std::printf("TI2V-5B form, image-to-video: latents within %.2e of max\n", err);
  EXPECT_LT(err, 1e-5);
  EXPECT_TRUE(at::equal(ours.narrow(2, 0, 1), condition.first));  // the picture's latent, as given
  // Without the first frame kept (the text-to-video call on the same noise) the result is another.
  const at::Tensor t2v = denoise_latents(cfg, read_transformer_weights(w.transformer), w.transformer, io.at("prompt"),
                                         io.at("negative"), io.at("noise"), at::kCPU, nullptr, false,
                                         ImageCondition{{}, {}, at::zeros_like(condition.first)});
  EXPECT_GT(relative(t2v, io.at("latents")), 1e-2);
  // A first-and-last-frame request is refused: TI2V takes one picture.
  r.last_image = png;
  EXPECT_NE(test::message_of([&] { make_image_condition(cfg, w, r, at::kCPU); }).find("first frame only"),
            std::string::npos);
}

// A small DiT of the first-frame form (4 channels in and out), its modulations not zero; `m` its shape.
DiT small_model(ModelConfig& m) {
  m.in_channels = m.out_channels = 4, m.patch = {1, 2, 2}, m.dim = 32, m.heads = 2, m.ffn_dim = 64, m.layers = 2;
  m.text_dim = 8, m.text_len = 4, m.freq_dim = 16;
  torch::manual_seed(0);
  DiT model(m);
  model->init_weights(5);
  for (auto& p : model->parameters()) p.data().add_(0.05 * at::randn_like(p));
  return model;
}

TEST(Ti2v, TimestepPerTokenAllEqualIsThePerSampleForward) {
  ModelConfig m;
  DiT model = small_model(m);
  torch::NoGradGuard ng;
  const at::Tensor x = at::randn({2, 4, 3, 4, 6}), text = at::randn({2, 4, 8});
  const at::Tensor t = at::tensor({300.0f, 800.0f});
  const int64_t L = 3 * 2 * 3;
  const at::Tensor per_sample = model->forward(x, t, text);
  const at::Tensor per_token = model->forward(x, t.reshape({2, 1}).expand({2, L}).contiguous(), text);
  EXPECT_LE(relative(per_token, per_sample), 1e-6);
  // The first frame's tokens at 0: the first frame's own output changes, and a wrong shape is named.
  const at::Tensor kept = model->forward(x, first_frame_timesteps(t, x.sizes(), m.patch), text);
  EXPECT_GT(relative(kept, per_sample), 1e-4);
  EXPECT_NE(test::message_of([&] { model->forward(x, at::zeros({2, L + 1}), text); }).find("one per token"),
            std::string::npos);
}

// On a GPU the per-token modulation takes the ATen composition (the fused LayerNorm kernels
// modulate per sample): the same output as the CPU's, in fp32 (TF32 off).
TEST(Ti2v, CudaTimestepPerTokenMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ModelConfig m;
  DiT model = small_model(m);
  torch::NoGradGuard ng;
  const at::Tensor x = at::randn({2, 4, 3, 4, 6}), text = at::randn({2, 4, 8});
  const at::Tensor t = first_frame_timesteps(at::tensor({300.0f, 800.0f}), x.sizes(), m.patch);
  const at::Tensor cpu = model->forward(x, t, text);
  const bool tf32 = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuBLAS(false);
  model->to(at::Device(at::kCUDA, 0));
  const at::Device gpu(at::kCUDA, 0);
  const at::Tensor cuda = model->forward(x.to(gpu), t.to(gpu), text.to(gpu)).cpu();
  at::globalContext().setAllowTF32CuBLAS(tf32);
  const double err = relative(cuda, cpu);
  std::printf("timestep per token, CUDA vs CPU (fp32): %.2e of max\n", err);
  EXPECT_LT(err, 1e-4);
}

// The block measurement behind train.memory_budget_gb takes the first-frame form's timestep per
// token: its per-token modulation (6 [B, L, dim] fp32 more per block) shows in the figure.
TEST(Ti2v, BlockMeasurementCountsThePerTokenModulation) {
  Config plain = test::tiny_config({"model.dim=64", "model.ffn_dim=128"});
  Config kept = plain;
  kept.model.condition = FrameCondition::first_frame;
  ASSERT_TRUE(fuses_first_frame(kept.model));
  const double a = measure_block_activations(plain, at::kCPU).keep.per_token,
               b = measure_block_activations(kept, at::kCPU).keep.per_token;
  std::printf("bytes per token a block holds: %.0f per sample's timestep, %.0f per token's\n", a, b);
  EXPECT_GT(b - a, 0.8 * 6 * 64 * 4);  // at least most of the 6 x dim fp32 modulation per token
}

// A run of the TI2V form on a cache: each clip's first latent frame goes in clean with timestep 0
// on its tokens, the rest noised at the sample's own timestep.
TEST(Ti2v, TrainingKeepsEachClipsFirstFrameClean) {
  test::ScratchDir dir("ti2v_train");
  {
    CacheWriter wr(dir / "cache", 0, 1 << 20, at::kFloat);
    for (int i = 0; i < 6; ++i) {
      CacheSample s;
      s.key = "clip" + std::to_string(i);
      s.mean = at::randn({4, 3, 4, 4});
      s.std = at::zeros({4, 3, 4, 4});
      s.text = at::randn({4, 8});
      s.bucket = "3x4x4";
      wr.add(s);
    }
  }
  merge_cache_index(dir / "cache");
  Config cfg = test::tiny_config({"data.source=\"cache\"", "data.cache_dir=\"" + (dir / "cache") + "\"",
                                  "model.condition=\"first_frame\"", "train.steps=2", "train.warmup_steps=1",
                                  "train.out_dir=\"" + (dir / "run") + "\"", "data.latent_frames=3"});
  ASSERT_TRUE(fuses_first_frame(cfg.model));
  auto cache = std::make_shared<const LatentCache>(cfg.data.cache_dir);
  struct Seen : StepTap {
    std::vector<at::Tensor> x, t;
    void micro_batch(int64_t, int64_t, const at::Tensor& x_t, const at::Tensor& timestep, const at::Tensor&,
                     const at::Tensor&, const at::Tensor&) override {
      x.push_back(x_t.clone()), t.push_back(timestep.clone());
    }
  };
  auto seen = std::make_shared<Seen>();
  Trainer trainer(cfg, std::make_shared<CacheLoader>(cache, cfg), at::zeros({cfg.model.text_len, cfg.model.text_dim}));
  trainer.set_step_tap(seen);
  const std::vector<double> losses = trainer.fit(-1, false);
  ASSERT_EQ(seen->x.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const at::Tensor& x = seen->x[k];
    const at::Tensor& t = seen->t[k];
    ASSERT_EQ(t.dim(), 2);
    EXPECT_EQ(t.size(1), 3 * 2 * 2);  // [B, L]: a timestep per token
    EXPECT_EQ(t.narrow(1, 0, 4).abs().max().item<double>(), 0.0);  // the first frame's 2 x 2 tokens
    EXPECT_GT(t.narrow(1, 4, 8).min().item<double>(), 0.0);
    // Every clip's first latent frame is one of the cached clips' first frames, untouched.
    for (int64_t b = 0; b < x.size(0); ++b) {
      bool found = false;
      for (int64_t i = 0; i < cache->size(); ++i)
        found = found || at::equal(x[b].narrow(1, 0, 1), cache->load(i).mean.narrow(1, 0, 1));
      EXPECT_TRUE(found) << "sample " << b << " of step " << k + 1;
    }
  }
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

// The first-frame form as a user runs it: `vidit prepare` with the Wan 2.2 VAE on real clips,
// `vidit train` from the release's transformer (each clip's first latent frame kept; sample.every
// continuing a clip's first frame, decoded by the Wan 2.2 VAE), and
// `vidit export --pipeline` into the release, whose model_index.json asks for a timestep per token,
// and diffusers' WanImageToVideoPipeline opens the result and samples from a picture.
TEST(Ti2v, PrepareTrainAndExportARunOfTheFirstFrameForm) {
  SKIP_WITHOUT_DECODING();
  namespace fs = std::filesystem;
  test::ScratchDir dir("ti2v_run");
  const std::string png = dir / "first.png", release = dir / "release";
  ASSERT_TRUE(video_test::ffmpeg("-f lavfi -i testsrc2=size=96x64 -frames:v 1 " + png));
  const auto made = test::run_process(test::python() + " " + test::reference_script("diffusers_ti2v_reference.py") +
                                      " " + release + " " + png + " 2>&1");
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;
  fs::create_directories(dir / "videos");
  for (int i = 0; i < 3; ++i) {
    const std::string f = dir / ("videos/clip" + std::to_string(i) + ".mp4");
    ASSERT_TRUE(video_test::ffmpeg("-f lavfi -i testsrc2=size=96x64:rate=8 -vf hue=h=" + std::to_string(60 * i) +
                                   " -frames:v 9 -pix_fmt yuv420p -c:v libx264 " + f));
    std::ofstream(dir / ("videos/clip" + std::to_string(i) + ".txt")) << "clip " << i;
  }
  const std::string config = dir / "ti2v.toml";
  std::ofstream(config) << "[model]\ndim = 32\nheads = 2\nlayers = 2\nffn_dim = 64\nfreq_dim = 32\npatch = [1, 2, 2]\n"
                        << "text_dim = 64\ntext_len = 512\neps = 1e-6\nrope_theta = 10000.0\nin_channels = 8\n"
                        << "out_channels = 8\ncondition = \"first_frame\"\n"
                        << "[data]\nsource = \"cache\"\nmanifest = \"" << (dir / "videos") << "\"\ncache_dir = \""
                        << (dir / "cache") << "\"\ncodec = \"wan22_vae\"\nvae_weights = \"" << release << "/vae\"\n"
                        << "cache_dtype = \"fp32\"\ndecode_threads = 1\nloader_threads = 1\ndecoder = \"cpu\"\n"
                        << "[demo]\ntext_dim = 64\n"
                        << "[buckets]\nresolutions = [78]\naspect_ratios = [1.5]\nframes = [9]\nframe_stride = 4\n"
                        << "multiple = 16\n[train]\nbatch_size = 2\nsteps = 2\nthreads = 1\nlog_every = 1\nlr = 1e-4\n"
                        << "warmup_steps = 0\ndevice = \"cpu\"\nout_dir = \"" << (dir / "run") << "\"\ninit_from = \""
                        << release << "/transformer\"\n[sample]\nevery = 2\nsteps = 2\ncount = 1\n";
  auto r = test::run_process(std::string(VIDIT_BINARY) + " prepare --config " + config + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const LatentCache cache(dir / "cache");
  ASSERT_EQ(cache.size(), 3);
  for (int64_t i = 0; i < cache.size(); ++i) {
    EXPECT_EQ(cache.entry(i).shape, (std::vector<int64_t>{8, 3, 4, 6})) << cache.entry(i).key;
    EXPECT_FALSE(cache.entry(i).cond) << "nothing beside the latent: its first frame is the condition";
  }
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + config + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step      2/2"), std::string::npos) << r.output;
  // sample.every: a clip's own first frame continued by the model, decoded by the Wan 2.2 VAE.
  EXPECT_NE(r.output.find("[sample] step 2: 1 video(s)"), std::string::npos) << r.output;
  const std::string pipe = dir / "exported";
  r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + pipe + " --pipeline " + release +
                        " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const TensorMap exported = read_transformer_weights(pipe + "/transformer"),
                  trained = read_checkpoint_weights(dir / "run").weights;
  for (const auto& [k, v] : trained) EXPECT_TRUE(at::equal(exported.at(k), v)) << k;
  // diffusers opens the exported folder and samples from a picture with a timestep per token.
  r = test::run_process(test::python() + " " + test::reference_script("diffusers_ti2v_reference.py") + " open " + pipe +
                        " " + png + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("WanImageToVideoPipeline with expand_timesteps"), std::string::npos) << r.output;
  // A release whose pipelines take one timestep per sample would sample it wrong: refused by name.
  fs::create_directories(dir / "plain");
  std::ofstream(dir / "plain/model_index.json") << R"({"_class_name": "WanImageToVideoPipeline"})";
  r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + (dir / "exported2") +
                        " --pipeline " + (dir / "plain") + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("does not set expand_timesteps"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "exported2"));
}

}  // namespace
}  // namespace vidit
