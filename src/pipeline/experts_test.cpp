// Two experts split by noise level (model/experts.h, Wan 2.2 A14B): sampling equal to diffusers'
// WanPipeline and WanImageToVideoPipeline with transformer_2 and boundary_ratio on the same random
// weights (tests/reference/diffusers_experts_reference.py); one expert's training draws exactly
// the noise levels it serves; a real `vidit train` of one expert from the release, exported into
// its folder of the release and sampled with `vidit sample --weights`; and each bad release or
// setting named.
#include "model/experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "diffusion/flow_matching.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "pipeline/image_condition.h"
#include "pipeline/pipeline_test_util.h"
#include "pipeline/wan_pipeline.h"
#include "text/text_test_util.h"
#include "train/run_weights.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

// The reference's release in `out` (with `image`: image-to-video); its exit status and output.
test::ProcessResult make_reference(const std::string& out, const std::string& image = "") {
  return test::run_process(test::python() + " " + test::reference_script("diffusers_experts_reference.py") + " " + out +
                           (image.empty() ? "" : " " + image) + " 2>&1");
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Experts, SamplingEqualsDiffusersWithTwoExperts) {
  test::ScratchDir dir("experts_parity");
  const std::string png = dir / "first.png";
  ASSERT_TRUE(video_test::ffmpeg("-f lavfi -i testsrc2=size=64x48 -frames:v 1 " + png));
  for (const bool i2v : {false, true}) {
    const std::string out = dir / (i2v ? "i2v" : "t2v");
    const auto made = make_reference(out, i2v ? png : "");
    if (made.status == 3) GTEST_SKIP() << made.output;
    ASSERT_EQ(made.status, 0) << made.output;
    const std::optional<ExpertRelease> experts = find_experts(out);
    ASSERT_TRUE(experts);
    EXPECT_EQ(experts->boundary, i2v ? 0.9 : 0.875);
    EXPECT_EQ(experts->model.in_channels, i2v ? 36 : 16);
    Config cfg = parse_config("", "<test>", {"sample.steps=6", "sample.shift=3.0", "sample.solver=\"unipc\"",
                                             "sample.cfg_scale=4.0", "sample.cfg_scale_2=3.0"});
    cfg.model = experts->model;
    const TensorMap io = load_safetensors(out + "/io.safetensors");
    ImageCondition condition;
    if (i2v) {  // the first frame through the release's VAE (no CLIP: Wan 2.2's experts take none)
      WanWeights w;
      w.vae = out + "/vae";
      VideoRequest r;
      r.frames = 9, r.width = 48, r.height = 32, r.image = png;
      condition = make_image_condition(cfg, w, r, at::kCPU);
    }
    auto sample = [&](const std::string& high, const std::string& low) {
      return denoise_latents(cfg, read_transformer_weights(high), high, io.at("prompt"), io.at("negative"),
                             io.at("noise"), at::kCPU, nullptr, false, condition,
                             Expert2Weights{read_transformer_weights(low), low});
    };
    const at::Tensor ours = sample(experts->high, experts->low), theirs = io.at("latents");
    const double err = (ours - theirs).abs().max().item<double>() / theirs.abs().max().item<double>();
    std::printf("%s two experts: latents within %.2e of max\n", i2v ? "image-to-video" : "text-to-video", err);
    EXPECT_LT(err, 1e-5);
    // Both experts matter: swapped, the result is another.
    const at::Tensor swapped = sample(experts->low, experts->high);
    EXPECT_GT((swapped - theirs).abs().max().item<double>(), 1e-2 * theirs.abs().max().item<double>());
  }
}

// One expert's noise levels: the distribution cut at the boundary, drawn by its inverse CDF, is
// the conditional one (against rejection sampling), inside its range; the whole range draws what
// sample_sigmas draws.
TEST(Experts, EachExpertTrainsOnExactlyItsNoiseLevels) {
  for (const auto sampling : {TimestepSampling::logit_normal, TimestepSampling::uniform}) {
    DiffusionConfig d;
    d.timestep_sampling = sampling, d.shift = 3.0;
    auto gen = [](uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); };
    at::Generator g1 = gen(7), g2 = gen(7);
    EXPECT_TRUE(at::equal(sample_sigmas(1000, d, g1), sample_sigmas(1000, d, g2, sigma_range(Expert::none, 0.875))));
    at::Generator g = gen(3);
    const at::Tensor all = sample_sigmas(400000, d, g);
    for (const Expert e : {Expert::high, Expert::low}) {
      const SigmaRange r = sigma_range(e, 0.875);
      at::Generator ge = gen(11);
      const at::Tensor cut = sample_sigmas(200000, d, ge, r);
      EXPECT_GE(cut.min().item<double>(), r.lo);
      EXPECT_LT(cut.max().item<double>(), r.hi);
      const at::Tensor kept = all.masked_select((all >= r.lo).logical_and(all < r.hi));
      ASSERT_GT(kept.numel(), 20000);
      for (const double q : {0.1, 0.5, 0.9}) {
        const double a = at::quantile(cut, q).item<double>(), b = at::quantile(kept, q).item<double>();
        EXPECT_NEAR(a, b, 0.004) << name_of(sampling) << " " << name_of(e) << " quantile " << q;
      }
    }
  }
}

// A small two-expert release in diffusers' layout at `root` (experts of `layers_2` layers for the
// low-noise one), with `index` as model_index.json.
void write_release(const std::string& root, const std::string& index, int64_t layers_2 = 2) {
  ModelConfig m = pipeline_test::tiny_wan();
  for (const auto& [part, layers] : {std::pair<std::string, int64_t>{"transformer", 2}, {"transformer_2", layers_2}}) {
    m.layers = layers;
    DiT model(m);
    write_diffusers_transformer(state_dict(*model), m, root + "/" + part);
  }
  std::ofstream(root + "/model_index.json") << index;
}

TEST(Experts, BadReleasesAndSettingsAreNamed) {
  test::ScratchDir dir("experts_bad");
  const std::string two = R"({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
      "transformer_2": ["diffusers", "WanTransformer3DModel"])";
  write_release(dir / "no_boundary", two + "}");
  std::string msg = message_of([&] { find_experts(dir / "no_boundary"); });
  EXPECT_NE(msg.find("no boundary_ratio"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model_index.json"), std::string::npos) << msg;
  write_release(dir / "outside", two + R"(, "boundary_ratio": 1.5})");
  msg = message_of([&] { find_experts(dir / "outside"); });
  EXPECT_NE(msg.find("must be in (0, 1)"), std::string::npos) << msg;
  write_release(dir / "shapes", two + R"(, "boundary_ratio": 0.875})", 3);
  msg = message_of([&] { find_experts(dir / "shapes"); });
  EXPECT_NE(msg.find("differ in shape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 layers"), std::string::npos) << msg;
  write_release(dir / "good", two + R"(, "boundary_ratio": 0.875})");
  ASSERT_TRUE(find_experts(dir / "good"));
  EXPECT_FALSE(find_experts(dir / "good/transformer"));
  EXPECT_EQ(expert_of_path(dir / "good/transformer"), Expert::high);
  EXPECT_EQ(expert_of_path(dir / "good/transformer_2/"), Expert::low);
  // Which weights a run starts from: the expert's folder of a release; the other expert refused.
  Config cfg = parse_config("", "<test>", {"model.boundary=0.875", "train.expert=\"low\""});
  cfg.train.init_from = dir / "good";
  EXPECT_EQ(expert_init_path(cfg), dir / "good/transformer_2");
  cfg.train.init_from = dir / "good/transformer";
  msg = message_of([&] { expert_init_path(cfg); });
  EXPECT_NE(msg.find("is the high-noise expert, but train.expert = \"low\""), std::string::npos) << msg;
  cfg.train.init_from = dir / "good", cfg.model.boundary = 0.9;
  msg = message_of([&] { expert_init_path(cfg); });
  EXPECT_NE(msg.find("set model.boundary = 0.875"), std::string::npos) << msg;
  // train.expert on a one-model run, and samples during one expert's run.
  msg = message_of([&] { parse_config("", "<test>", {"train.expert=\"high\""}); });
  EXPECT_NE(msg.find("model.boundary = 0 (one model)"), std::string::npos) << msg;
  msg = message_of([&] { parse_config("", "<test>", {"model.boundary=0.875", "train.expert=\"high\"", "sample.every=10"}); });
  EXPECT_NE(msg.find("a video needs both experts"), std::string::npos) << msg;
  msg = message_of([&] { parse_config("", "<test>", {"model.boundary=1.0"}); });
  EXPECT_NE(msg.find("model.boundary"), std::string::npos) << msg;
}

// The two-expert denoise on CUDA (bf16 autocast) against the CPU's (fp32) on the same random
// release: the GPU path of the switch and of the per-expert guidance (bench/gpu/run.sh runs it).
TEST(Experts, CudaSamplingMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  test::ScratchDir dir("experts_cuda");
  write_release(dir / "r", R"({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
      "transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875})");
  const std::optional<ExpertRelease> e = find_experts(dir / "r");
  ASSERT_TRUE(e);
  Config cfg = parse_config("", "<test>", {"sample.steps=6", "sample.shift=3.0", "sample.solver=\"unipc\"",
                                           "sample.cfg_scale=4.0", "sample.cfg_scale_2=3.0"});
  cfg.model = e->model;
  torch::manual_seed(4);
  const at::Tensor noise = at::randn({1, 16, 3, 4, 6}), context = at::randn({1, 512, cfg.model.text_dim}),
                   negative = at::randn({1, 512, cfg.model.text_dim});
  auto run = [&](at::Device device) {
    return denoise_latents(cfg, read_transformer_weights(e->high), e->high, context, negative, noise, device, nullptr,
                           false, {}, Expert2Weights{read_transformer_weights(e->low), e->low}).cpu();
  };
  const at::Tensor cpu = run(at::kCPU), cuda = run(at::Device(at::kCUDA, 0));
  const double err = (cuda - cpu).abs().max().item<double>() / cpu.abs().max().item<double>();
  std::printf("two experts, CUDA (bf16 autocast) vs CPU: %.2e of max\n", err);
  EXPECT_LT(err, 5e-2);
}

// As a user trains Wan 2.2: the low-noise expert of a two-expert release, trained alone (`vidit
// train` from the release's root), exported into the release's transformer_2/ (the high-noise
// expert and the rest linked), and into Wan's own layout (low_noise_model/), and the result
// sampled by `vidit sample --weights`.
TEST(Experts, TrainOneExpertExportItAndSampleTheRelease) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("experts_train");
  const std::string release = dir / "release";
  const auto made = make_reference(release);
  if (made.status == 3) GTEST_SKIP() << made.output;
  ASSERT_EQ(made.status, 0) << made.output;
  std::ofstream(dir / "low.toml")
      << "[model]\ndim = 32\nheads = 2\nlayers = 2\nffn_dim = 64\nfreq_dim = 32\npatch = [1, 2, 2]\ntext_dim = 64\n"
         "text_len = 512\neps = 1e-6\nrope_theta = 10000.0\nin_channels = 16\nout_channels = 16\nboundary = 0.875\n"
         "[data]\nsource = \"synthetic\"\nlatent_frames = 3\nlatent_height = 4\nlatent_width = 6\n"
         "[train]\nsteps = 2\nbatch_size = 2\nthreads = 1\nlog_every = 1\nwarmup_steps = 0\nlr = 1e-3\ndevice = \"cpu\"\n"
         "expert = \"low\"\ninit_from = \"" << release << "\"\nout_dir = \"" << (dir / "run") << "\"\n";
  auto r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + (dir / "low.toml") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("train.init_from: " + release + "/transformer_2"), std::string::npos) << r.output;

  // Into the release's transformer_2/; transformer/ (the high-noise expert) and the rest linked.
  const std::string out = dir / "exported";
  r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + out + " --pipeline " + release + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("transformer_2/ written"), std::string::npos) << r.output;
  EXPECT_GT(fs::hard_link_count(out + "/transformer/config.json"), 1u);
  const TensorMap trained = read_checkpoint_weights(dir / "run").weights, low = read_transformer_weights(out + "/transformer_2");
  ASSERT_EQ(trained.size(), low.size());
  for (const auto& [k, v] : trained) EXPECT_TRUE(at::equal(low.at(k), v)) << k;
  EXPECT_FALSE(at::equal(low.at("blocks.0.ffn.0.weight"), read_transformer_weights(release + "/transformer_2").at("blocks.0.ffn.0.weight")));

  // Wan 2.2's own layout: the same experts as high_noise_model/ and low_noise_model/ beside the
  // other files; the run's expert is written into low_noise_model/ under official names (the
  // release's config.json kept), the rest linked, and the result reads as a two-expert release.
  {
    const std::string official = dir / "official";
    const ModelConfig shape = find_experts(release)->model;
    write_wan_transformer(read_transformer_weights(release + "/transformer"), shape, official + "/high_noise_model");
    write_wan_transformer(read_transformer_weights(release + "/transformer_2"), shape, official + "/low_noise_model");
    fs::create_directories(official + "/google/umt5-xxl");
    std::ofstream(official + "/google/umt5-xxl/tokenizer.json") << "{}";
    std::ofstream(official + "/Wan2.1_VAE.safetensors") << "not read here";
    const std::string mine = dir / "official_mine";
    r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + mine + " --pipeline " + official +
                          " 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("low_noise_model/ written"), std::string::npos) << r.output;
    const TensorMap written = read_transformer_weights(mine + "/low_noise_model");
    for (const auto& [k, v] : trained) EXPECT_TRUE(at::equal(written.at(k), v)) << k;
    for (const char* linked : {"/high_noise_model/config.json", "/low_noise_model/config.json", "/Wan2.1_VAE.safetensors",
                               "/google/umt5-xxl/tokenizer.json"})
      EXPECT_GT(fs::hard_link_count(mine + linked), 1u) << linked;
    const std::optional<ExpertRelease> again = find_experts(mine);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->boundary, 0.875);
    // A folder that is neither layout is named, and nothing is written.
    r = test::run_process(std::string(VIDIT_BINARY) + " export " + (dir / "run") + " " + (dir / "official_2") +
                          " --pipeline " + (dir / "run") + " 2>&1");
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.output.find("has no model_index.json"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "official_2"));
  }

  // The exported release sampled as it ships (the text encoder linked in: the reference has none).
  fs::create_directory_symlink(ref + "/pipe/text_encoder", out + "/text_encoder");
  fs::create_directory_symlink(ref + "/pipe/tokenizer", out + "/tokenizer");
  r = test::run_process(std::string(VIDIT_BINARY) + " sample --weights " + out + " -p 'a cat' --frames 5 --size 48x32"
                        " --set sample.steps=6 --set train.device=\\\"cpu\\\" -o " + (dir / "cat.mp4") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Wan 2.2 text-to-video A14B (two experts): UniPC, shift 3 from the release's"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("guidance 4, low-noise guidance 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[sample] the low-noise expert from step 3 (timestep below 875)"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "cat.mp4"));

  // The other expert's folder as the start of a low-noise run: refused, nothing trained.
  r = test::run_process(std::string(VIDIT_BINARY) + " train --config " + (dir / "low.toml") + " --set train.init_from=\\\"" +
                        release + "/transformer\\\" --set train.out_dir=\\\"" + (dir / "run2") + "\\\" 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("is the high-noise expert"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run2/checkpoints"));
}

}  // namespace
}  // namespace vidit
