// The sampling memory model (sample_memory.h) against measurements on the CPU: each phase of
// generate_video on a tiny release folder, its peak as the pipeline reports it (the peak of
// ATen's host allocations, core/host_peak.h), must be within kTolerance of the prediction; then
// the denoise and decode phases alone at two sizes each (and decode tiled), with models small
// enough that activations, not weights, decide; and the Wan 2.1 shapes give the numbers their
// parameter counts say.
#include "pipeline/sample_memory.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/host_peak.h"
#include "diffusion/sampler.h"
#include "model/dit.h"
#include "model/model_info.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "text/text_test_util.h"
#include "text/tokenizer.h"
#include "../../tests/test_util.h"
#include "pipeline/pipeline_test_util.h"
#include "pipeline/image_condition.h"
#include "vae/vae_layout.h"
#include "vision/vision_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

// The prediction may miss the measurement by this fraction of the measurement.
constexpr double kTolerance = 0.25;

double rel(int64_t predicted, int64_t measured) {
  return std::abs(double(predicted) - double(measured)) / double(std::max<int64_t>(measured, 1));
}

TEST(SampleMemory, HostPeakCountsAllocationsAndFrees) {
  HostPeak outer;
  ASSERT_TRUE(outer.active());
  {
    HostPeak inner;
    at::Tensor a = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    at::Tensor b = at::empty({1 << 19}, at::kFloat);  // 2 MiB
    a.reset();
    EXPECT_EQ(inner.peak(), 6 << 20);
    EXPECT_EQ(inner.current(), 2 << 20);
  }
  EXPECT_EQ(outer.peak(), 6 << 20);  // the nested one counted for it too
  EXPECT_EQ(outer.current(), 0);
}

using pipeline_test::make_release;
using pipeline_test::tiny_wan;

// What `vidit sample` reports for each phase (PhaseReport::peak_bytes, now the host peak) against
// the prediction for the same run. At this size the VAE's loading decides the decode phase; the
// direct tests below put the activations of the DiT and of the VAE in charge, at two sizes each.
TEST(SampleMemory, PipelinePhasesMatchThePrediction) {
  VIDIT_UMT5_REFERENCE(ref);
  test::ScratchDir dir("sample_memory");
  const std::string root = make_release(dir, ref);
  Config cfg = parse_config("", "<test>", {"sample.steps=2", "sample.cfg_scale=5.0", "sample.solver=\"unipc\""});
  cfg.model = read_transformer_config(root + "/transformer");
  WanWeights w;
  w.fill_from(root);
  VideoRequest req;
  req.prompt = "a red fox runs through deep snow under a pale winter sun, its breath steaming in the cold air";
  const text::Tokenizer tok(ref + "/pipe/tokenizer");
  const text::TokenizedBatch t = tok.tokenize({req.prompt, ""}, cfg.model.text_len);
  for (auto [frames, width, height] : {std::array<int64_t, 3>{9, 96, 64}}) {
    req.frames = frames, req.width = width, req.height = height;
    SampleMemoryInputs in = sample_memory_inputs(cfg, req, at::kCPU);
    in.text = text::Umt5Config::from_json_file(ref + "/pipe/text_encoder/config.json");
    in.prompt_tokens = t.lengths[0], in.negative_tokens = t.lengths[1];
    const SampleMemory predicted = predict_sample_memory(in);
    const VideoResult r = generate_video(cfg, w, req, at::kCPU, {}, /*verbose=*/false);
    ASSERT_EQ(r.phases.size(), 3u);
    std::printf("%s", format_sample_memory(in, predicted).c_str());
    for (size_t i = 0; i < 3; ++i) {
      const PhaseMemory& p = predicted.phases[i];
      const int64_t measured = r.phases[i].peak_bytes;
      std::printf("  %-8s predicted %10lld  measured %10lld  (%+.1f%%), %.1f s\n", p.name.c_str(), (long long)p.peak,
                  (long long)measured, 100.0 * (double(p.peak) - double(measured)) / double(measured), r.phases[i].seconds);
      EXPECT_LT(rel(p.peak, measured), kTolerance) << p.name << " at " << frames << "x" << width << "x" << height;
    }
  }
}

// The denoise phase with a DiT whose blocks' activations are most of it: the same calls as
// generate_video's phase 2 (the text context comes from phase 1, so it is made before).
TEST(SampleMemory, DenoiseMatchesThePredictionAtTwoSizes) {
  c10::InferenceMode inference;
  test::ScratchDir dir("sample_memory_dit");
  Config cfg = parse_config("", "<test>", {"sample.steps=2", "sample.cfg_scale=5.0", "sample.solver=\"unipc\""});
  cfg.model = tiny_wan();
  cfg.model.dim = 64, cfg.model.ffn_dim = 192, cfg.model.heads = 4;
  {
    torch::manual_seed(5);
    DiT model(cfg.model);
    save_safetensors(dir / "dit.safetensors", state_dict(*model));
  }
  const at::Tensor context = at::randn({1, 512, cfg.model.text_dim}), negative = at::randn({1, 512, cfg.model.text_dim});
  int64_t activations[2] = {0, 0};
  int i = 0;
  for (auto [frames, width, height] : {std::array<int64_t, 3>{9, 128, 96}, std::array<int64_t, 3>{17, 192, 128}}) {
    VideoRequest req;
    req.frames = frames, req.width = width, req.height = height;
    const PhaseMemory p = predict_sample_memory(sample_memory_inputs(cfg, req, at::kCPU)).phases[1];
    HostPeak meter;
    at::Tensor noise = at::randn(latent_shape(req, cfg.model), at::make_generator<at::CPUGeneratorImpl>(1), at::kFloat);
    DiT model(cfg.model);
    load_state_dict(*model, read_transformer_weights(dir / "dit.safetensors"), "dit");
    model->eval();
    auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& txt) {
      return model->forward(x, t, txt).to(at::kFloat);
    };
    const at::Tensor lat = sample_latents(field, noise, context, negative, cfg.sample);
    const int64_t measured = meter.peak();
    std::printf("denoise %lldx%lldx%lld: predicted %lld (weights %lld, activations %lld, at %s), measured %lld (%+.1f%%)\n",
                (long long)frames, (long long)width, (long long)height, (long long)p.peak, (long long)p.weights,
                (long long)p.activations, p.peak_at.c_str(), (long long)measured,
                100.0 * (double(p.peak) - double(measured)) / double(measured));
    EXPECT_LT(rel(p.peak, measured), kTolerance) << frames << "x" << width << "x" << height;
    EXPECT_GT(p.activations, 2 * p.weights) << "the weights decide: the test no longer checks the activations";
    activations[i++] = p.activations;
  }
  EXPECT_GT(activations[1], 2 * activations[0]);  // the sizes differ enough to tell a term's scaling
}

// The decode phase with a small VAE, so the causal cache, the busiest layer and the frames carry
// the peak: the same calls as generate_video's phase 3, measured the same way.
int64_t measure_decode(const WanVAEConfig& vc, const std::string& file, const at::Tensor& latents, bool tiled) {
  HostPeak meter;
  WanVAE vae(vc, at::TensorOptions().device(at::kCPU));
  load_wan_vae(*vae, file);
  vae->eval();
  VaeRunOptions ro;
  ro.tiling.enabled = tiled;
  at::Tensor video = vae->decode_latents(latents, ro);
  at::Tensor frames = ((video[0].permute({1, 2, 3, 0}) + 1.0) * 127.5).round().clamp(0, 255).to(at::kByte).to(at::kCPU).contiguous();
  EXPECT_EQ(frames.size(0), 1 + 4 * (latents.size(2) - 1));
  return meter.peak();
}

TEST(SampleMemory, DecodeOfASmallVaeMatchesThePrediction) {
  c10::InferenceMode inference;
  test::ScratchDir dir("sample_memory_vae");
  WanVAEConfig vc;
  vc.base_dim = 8;
  {
    WanVAE vae(vc);
    save_safetensors(dir / "vae.safetensors", state_dict(*vae));
  }
  SampleMemoryInputs in;
  in.model = tiny_wan(), in.vae = vc;
  // Untiled at two sizes, then tiled (256-pixel tiles) at a size wider than a tile.
  for (auto [frames, width, height, tiled] : {std::array<int64_t, 4>{9, 64, 64, 0}, std::array<int64_t, 4>{17, 96, 64, 0},
                                              std::array<int64_t, 4>{5, 320, 96, 1}}) {
    in.frames = frames, in.width = width, in.height = height, in.tiled = tiled != 0;
    const PhaseMemory p = predict_sample_memory(in).phases[2];
    const at::Tensor latents = at::randn({1, 16, (frames - 1) / 4 + 1, height / 8, width / 8});
    const int64_t measured = measure_decode(vc, dir / "vae.safetensors", latents, tiled != 0);
    std::printf("decode %lldx%lldx%lld%s: predicted %lld (weights %lld, activations %lld, at %s), measured %lld (%+.1f%%)\n",
                (long long)frames, (long long)width, (long long)height, tiled ? " tiled" : "", (long long)p.peak,
                (long long)p.weights, (long long)p.activations, p.peak_at.c_str(), (long long)measured,
                100.0 * (double(p.peak) - double(measured)) / double(measured));
    EXPECT_LT(rel(p.peak, measured), kTolerance) << frames << "x" << width << "x" << height;
    EXPECT_GT(p.activations, 2 * p.weights) << "the weights decide: the test no longer checks the activations";
  }
}

// The image phase of image-to-video (make_image_condition, as generate_video calls it) with a
// small VAE and the reference's small CLIP, so that the encoder's chunks, not the weights, carry
// the peak, at two sizes; first-and-last frame at the second.
TEST(SampleMemory, ImagePhaseMatchesThePredictionAtTwoSizes) {
  const auto& clip_ref = vision::test::clip_vision_reference();
  if (!clip_ref.skip.empty()) GTEST_SKIP() << clip_ref.skip;
  ASSERT_TRUE(clip_ref.error.empty()) << clip_ref.error;
  c10::InferenceMode inference;
  test::ScratchDir dir("sample_memory_image");
  WanVAEConfig vc;
  vc.base_dim = 8;
  {
    WanVAE vae(vc);
    write_diffusers_vae(state_dict(*vae), vc, dir / "vae");
  }
  WanWeights w;
  w.vae = dir / "vae";
  w.image_encoder = clip_ref.dir + "/pipe/image_encoder";
  // The small encoder takes 32-pixel pictures: its processor crops to that.
  std::ofstream(dir / "processor.json") << R"({"crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 32}})";
  w.image_processor = dir / "processor.json";
  const vision::ClipVisionConfig clip = vision::ClipVisionConfig::from_json_file(w.image_encoder + "/config.json");
  Config cfg = parse_config("", "<test>", {});
  cfg.model = tiny_wan();
  cfg.model.in_channels = 36, cfg.model.image_dim = clip.hidden_size;
  ASSERT_EQ(0, std::system(("ffmpeg -v error -y -f lavfi -i testsrc2=size=160x96 -frames:v 1 " + (dir / "p.png")).c_str()));
  for (auto [frames, width, height, last] : {std::array<int64_t, 4>{9, 96, 64, 0}, std::array<int64_t, 4>{17, 192, 128, 1}}) {
    cfg.model.condition = last ? FrameCondition::first_last_frame : FrameCondition::first_frame;
    VideoRequest req;
    req.frames = frames, req.width = width, req.height = height, req.image = dir / "p.png";
    if (last) req.last_image = req.image;
    SampleMemoryInputs in = sample_memory_inputs(cfg, req, at::kCPU);
    in.vae = vc, in.clip = clip, in.vae_file_bytes = 4;
    const PhaseMemory p = predict_sample_memory(in).phase("image");
    HostPeak meter;
    const ImageCondition c = make_image_condition(cfg, w, req, at::kCPU);
    const int64_t measured = meter.peak();
    ASSERT_EQ(c.frames.size(1), 20);
    ASSERT_EQ(c.image.size(1), (last ? 2 : 1) * clip.tokens());
    std::printf("image %lldx%lldx%lld%s: predicted %lld (weights %lld, activations %lld, at %s), measured %lld (%+.1f%%)\n",
                (long long)frames, (long long)width, (long long)height, last ? " first+last" : "", (long long)p.peak,
                (long long)p.weights, (long long)p.activations, p.peak_at.c_str(), (long long)measured,
                100.0 * (double(p.peak) - double(measured)) / double(measured));
    EXPECT_LT(rel(p.peak, measured), kTolerance) << frames << "x" << width << "x" << height;
    EXPECT_GT(p.activations, 2 * p.weights) << "the weights decide: the test no longer checks the activations";
  }
}

TEST(SampleMemory, WanShapesAt81x832x480) {
  Config cfg = parse_config("", "<test>", {"sample.cfg_scale=5.0", "sample.solver=\"unipc\""});
  VideoRequest req;  // 81 x 832 x 480
  const int64_t vae_params = count_vae_parameters(WanVAEConfig{});
  EXPECT_GT(vae_params, 100'000'000);
  EXPECT_LT(vae_params, 150'000'000);
  for (auto [dim, ffn, heads, layers, billions] : {std::array<double, 5>{1536, 8960, 12, 30, 1.419},
                                                   std::array<double, 5>{5120, 13824, 40, 40, 14.288}}) {
    ModelConfig& m = cfg.model;
    m.dim = int64_t(dim), m.ffn_dim = int64_t(ffn), m.heads = int64_t(heads), m.layers = int64_t(layers);
    m.in_channels = m.out_channels = 16, m.patch = {1, 2, 2}, m.text_dim = 4096, m.text_len = 512, m.freq_dim = 256;
    const SampleMemoryInputs in = sample_memory_inputs(cfg, req, at::Device(at::kCUDA));
    const SampleMemory s = predict_sample_memory(in);
    std::printf("%s", format_sample_memory(in, s).c_str());
    const PhaseMemory& text = s.phases[0];
    const PhaseMemory& dit = s.phases[1];
    const PhaseMemory& vae = s.phases[2];
    EXPECT_EQ(dit.weights, count_parameters(m) * 4);  // fp32 weights, to the byte
    EXPECT_NEAR(double(count_parameters(m)) / 1e9, billions, 0.01);
    EXPECT_EQ(vae.weights, vae_params * 4);
    // umT5-XXL's encoder in bf16: about 5.7 B parameters, 11.4 GB.
    EXPECT_NEAR(double(text.weights) / 1e9, 11.35, 0.2);
    EXPECT_EQ(dit.loading, 0);  // on CUDA the file is read on the host
    // 21 x 30 x 52 = 32760 tokens, batch 2. The sampling DiT's parameters require no gradient,
    // so bf16 autocast keeps no copy of them: activations only.
    EXPECT_NE(dit.peak_at.find("32760 tokens x batch 2"), std::string::npos) << dit.peak_at;
    EXPECT_LT(dit.activations, int64_t(40e9));
    // 14B: the DiT sets the peak. 1.3B: umT5-XXL does, while it loads (its q,k,v and FFN inputs
    // are concatenated while the loaded tensors are still held).
    EXPECT_EQ(s.peak_phase, dim > 2000 ? "denoise" : "text");
    EXPECT_EQ(text.peak_at, "loading");
    // Twice the tokens: the DiT's activations about double.
    VideoRequest big = req;
    big.frames = 161;
    const SampleMemory b = predict_sample_memory(sample_memory_inputs(cfg, big, at::Device(at::kCUDA)));
    EXPECT_GT(double(b.phases[1].activations), 1.6 * double(dit.activations));
    // sample.dtype = "bf16": the projections' half of the bytes; 14B then fits an 80 GB card.
    Config half = cfg;
    half.sample.dtype = Precision::bf16;
    const SampleMemory h = predict_sample_memory(sample_memory_inputs(half, req, at::Device(at::kCUDA)));
    EXPECT_LT(h.phases[1].weights, dit.weights * 0.51);
    EXPECT_GT(h.phases[1].weights, dit.weights * 0.5);
    if (dim > 2000) EXPECT_LT(h.peak, int64_t(80e9));
    // 8 ranks: guidance on two halves (batch 1), the tokens split over 4 (14B: 40 heads, Ulysses 4).
    const SampleMemoryInputs in8 = sample_memory_inputs(half, req, at::Device(at::kCUDA), 8);
    EXPECT_TRUE(in8.halves);
    EXPECT_EQ(in8.sp, 4);
    const SampleMemory r8 = predict_sample_memory(in8);
    EXPECT_NE(r8.phases[1].peak_at.find("8190 tokens x batch 1"), std::string::npos) << r8.phases[1].peak_at;
    EXPECT_LT(r8.phases[1].activations, h.phases[1].activations / 6);
  }
  // Wan 2.1 I2V 14B: an image phase (the VAE encoding the condition video, then CLIP ViT-H/14,
  // 0.63 B parameters), 36 input channels and 257 image tokens; the DiT still sets the run's peak.
  ModelConfig& m = cfg.model;
  m.in_channels = 36, m.image_dim = 1280, m.condition = FrameCondition::first_frame;
  EXPECT_NEAR(double(vision::ClipVisionConfig::vit_h_14().parameters()) / 1e9, 0.63, 0.01);
  const SampleMemory i2v = predict_sample_memory(sample_memory_inputs(cfg, req, at::Device(at::kCUDA)));
  ASSERT_EQ(i2v.phases.size(), 4u);
  const PhaseMemory& image = i2v.phase("image");
  std::printf("I2V 14B image phase: weights %.2f GiB, activations %.2f GiB, peak %.2f GiB at %s\n",
              double(image.weights) / (1 << 30), double(image.activations) / (1 << 30), double(image.peak) / (1 << 30),
              image.peak_at.c_str());
  // Tiled at 256 pixels the VAE's encoding stays below CLIP's 2.35 GiB of weights.
  EXPECT_EQ(image.peak_at, "CLIP");
  EXPECT_NEAR(double(image.weights) / (1 << 30), 2.35, 0.01);
  EXPECT_EQ(i2v.peak_phase, "denoise");
  m.image_dim = 0, m.condition = FrameCondition::none, m.in_channels = 16;
  EXPECT_GT(i2v.phase("denoise").activations, predict_sample_memory(sample_memory_inputs(cfg, req, at::Device(at::kCUDA)))
                                                  .phase("denoise").activations);
}

}  // namespace
}  // namespace vidit
