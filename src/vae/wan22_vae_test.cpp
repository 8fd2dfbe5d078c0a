// The Wan 2.2 VAE (wan22_vae.h): its parameters are diffusers' AutoencoderKLWan(is_residual=True)
// names and shapes; shapes of encode / decode; the chunked run equals the whole-clip run; encode
// and decode equal diffusers' own on a small random model it saved
// (tests/reference/diffusers_vae22_reference.py, run with the project's Python; skipped where it or
// diffusers is missing); and a config.json that is not a Wan 2.2 VAE's is refused by name.
#include "vae/wan22_vae.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../../tests/mpi_test_util.h"
#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/state_dict.h"
#include "vae/vae_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using test::message_of;
using test::ScratchDir;

#define EXPECT_MESSAGE_HAS(message, needle) \
  EXPECT_NE((message).find(needle), std::string::npos) << "no '" << (needle) << "' in: " << (message)

// max |a - b| / max |b|
double relative_deviation(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(1e-12, b.abs().max().item<double>());
}

// Wan 2.2's structure (4 stages of 2 residual blocks, time halved in the last two downsamplings,
// 2x2 patches) at small widths; the reference builds the same.
Wan22VAEConfig tiny_config() {
  Wan22VAEConfig c;
  c.base_dim = 8;
  c.decoder_base_dim = 16;
  c.z_dim = 8;
  c.latent_mean.assign(8, 0.1f);
  c.latent_std.assign(8, 0.5f);
  return c;
}

// Random weights everywhere (as vae_test_util.h's random_vae), so every path carries signal.
Wan22VAE random_vae22(const Wan22VAEConfig& cfg, uint64_t seed) {
  torch::manual_seed(seed);
  Wan22VAE vae(cfg);
  test::randomize_parameters(*vae);
  vae->eval();
  return vae;
}

VaeRunOptions whole_clip() {
  VaeRunOptions o;
  o.chunked = false;
  return o;
}

using Wan22VAETest = test::OneThreadTest;

TEST_F(Wan22VAETest, ParametersAreDiffusersNamesAndShapes) {
  // The released Wan 2.2 VAE, without memory: AutoencoderKLWan(base_dim=160, decoder_base_dim=256,
  // z_dim=48, is_residual=True, in/out_channels=12, patch_size=2) has 196 tensors, 704,688,668 values.
  Wan22VAE meta(Wan22VAEConfig{}, at::TensorOptions().device(at::kMeta));
  std::map<std::string, std::vector<int64_t>> shapes;
  int64_t values = 0;
  for (const auto& item : meta->named_parameters()) {
    shapes[item.key()] = item.value().sizes().vec();
    values += item.value().numel();
  }
  EXPECT_EQ(shapes.size(), 196u);
  EXPECT_EQ(values, 704688668);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"encoder.conv_in.weight", {160, 12, 3, 3, 3}},
      {"encoder.down_blocks.0.resnets.1.norm2.gamma", {160, 1, 1, 1}},
      {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight", {320, 160, 1, 1, 1}},
      {"encoder.down_blocks.0.downsampler.resample.1.weight", {160, 160, 3, 3}},
      {"encoder.down_blocks.2.downsampler.time_conv.weight", {640, 640, 3, 1, 1}},
      {"encoder.mid_block.attentions.0.to_qkv.weight", {1920, 640, 1, 1}},
      {"encoder.mid_block.attentions.0.norm.gamma", {640, 1, 1}},
      {"encoder.mid_block.resnets.1.conv2.bias", {640}},
      {"encoder.norm_out.gamma", {640, 1, 1, 1}},
      {"encoder.conv_out.weight", {96, 640, 3, 3, 3}},
      {"quant_conv.weight", {96, 96, 1, 1, 1}},
      {"post_quant_conv.weight", {48, 48, 1, 1, 1}},
      {"decoder.conv_in.weight", {1024, 48, 3, 3, 3}},
      {"decoder.up_blocks.0.resnets.2.conv1.weight", {1024, 1024, 3, 3, 3}},
      {"decoder.up_blocks.0.upsampler.time_conv.weight", {2048, 1024, 3, 1, 1}},
      {"decoder.up_blocks.2.upsampler.resample.1.weight", {512, 512, 3, 3}},
      {"decoder.up_blocks.3.resnets.0.conv_shortcut.weight", {256, 512, 1, 1, 1}},
      {"decoder.conv_out.weight", {12, 256, 3, 3, 3}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  // No upsampler in time where the encoder did not downsample in time, and none in the last stage.
  EXPECT_FALSE(shapes.count("decoder.up_blocks.2.upsampler.time_conv.weight"));
  EXPECT_FALSE(shapes.count("decoder.up_blocks.3.upsampler.resample.1.weight"));
  EXPECT_FALSE(shapes.count("encoder.down_blocks.0.downsampler.time_conv.weight"));
  EXPECT_FALSE(shapes.count("encoder.down_blocks.3.downsampler.resample.1.weight"));
  EXPECT_EQ(Wan22VAEConfig{}.spatial_factor(), 16);
  EXPECT_EQ(Wan22VAEConfig{}.temporal_factor(), 4);
}

TEST_F(Wan22VAETest, PatchifyIsInvertedByUnpatchify) {
  at::Tensor x = at::randn({2, 3, 2, 6, 10});
  at::Tensor p = wan22_patchify(x, 2);
  EXPECT_EQ(p.sizes(), (std::vector<int64_t>{2, 12, 2, 3, 5}));
  EXPECT_TRUE(at::equal(wan22_unpatchify(p, 2), x));
  // Channel c*4 + col*2 + row holds pixel (2i + row, 2j + col) of colour c (diffusers' order).
  EXPECT_EQ(p[1][4 * 2 + 1 * 2 + 0][1][2][3].item<float>(), x[1][2][1][2 * 2 + 0][2 * 3 + 1].item<float>());
  EXPECT_EQ(p[0][4 * 1 + 0 * 2 + 1][0][1][4].item<float>(), x[0][1][0][2 * 1 + 1][2 * 4 + 0].item<float>());
}

TEST_F(Wan22VAETest, ShapesAndChunkedRunEqualsWholeClip) {
  Wan22VAE vae = random_vae22(tiny_config(), 1);
  at::NoGradGuard ng;
  torch::manual_seed(10);
  for (int64_t T : {1, 5, 13}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    at::Tensor video = at::rand({2, 3, T, 32, 48}) * 2 - 1;
    const VaeMoments m = vae->encode(video), whole = vae->encode(video, whole_clip());
    const std::vector<int64_t> latent = {2, 8, 1 + (T - 1) / 4, 2, 3};
    EXPECT_EQ(m.mean.sizes(), latent);
    EXPECT_EQ(m.logvar.sizes(), latent);
    EXPECT_LT(relative_deviation(m.mean, whole.mean), 1e-5);
    EXPECT_LT(relative_deviation(m.logvar, whole.logvar), 1e-5);
    const at::Tensor raw = vae->decode_raw(m.mean), raw_whole = vae->decode_raw(m.mean, whole_clip());
    EXPECT_EQ(raw.sizes(), video.sizes());
    EXPECT_LT(relative_deviation(raw, raw_whole), 1e-5);
    EXPECT_TRUE(at::equal(vae->decode(m.mean), raw.clamp(-1, 1)));
    const at::Tensor pixels = vae->decode_latents(vae->encode_latents(video));
    EXPECT_EQ(pixels.sizes(), video.sizes());
    EXPECT_LE(pixels.abs().max().item<double>(), 1.0);
  }
  // Causal: frames after frame 0 do not change latent frame 0.
  at::Tensor video = at::rand({1, 3, 9, 32, 32}) * 2 - 1, changed = video.clone();
  changed.slice(2, 1).uniform_(-1, 1);
  const at::Tensor a = vae->encode(video).mean, b = vae->encode(changed).mean;
  EXPECT_TRUE(at::allclose(a.slice(2, 0, 1), b.slice(2, 0, 1), 1e-6, 1e-6));
  EXPECT_GT((a.slice(2, 1) - b.slice(2, 1)).abs().max().item<double>(), 1e-3);

  EXPECT_MESSAGE_HAS(message_of([&] { vae->encode(at::zeros({1, 3, 8, 32, 32})); }), "1 + 4k");
  EXPECT_MESSAGE_HAS(message_of([&] { vae->encode(at::zeros({1, 3, 5, 24, 32})); }), "multiples of 16");
  EXPECT_MESSAGE_HAS(message_of([&] { vae->decode(at::zeros({1, 16, 2, 2, 2})); }), "latents must be [B, 8,");
}

TEST_F(Wan22VAETest, TilingKeepsShapes) {
  Wan22VAE vae = random_vae22(tiny_config(), 2);
  at::NoGradGuard ng;
  VaeRunOptions tiled;
  tiled.tiling.enabled = true;
  tiled.tiling.tile = 32;
  tiled.tiling.stride = 16;
  at::Tensor video = at::rand({1, 3, 5, 48, 64}) * 2 - 1;
  const at::Tensor mean = vae->encode(video, tiled).mean;
  EXPECT_EQ(mean.sizes(), (std::vector<int64_t>{1, 8, 2, 3, 4}));
  EXPECT_EQ(vae->decode(mean, tiled).sizes(), video.sizes());
  tiled.tiling.tile = 40;  // not a multiple of 16
  EXPECT_MESSAGE_HAS(message_of([&] { vae->encode(video, tiled); }), "multiples of 16");
}

// ---- against diffusers ---------------------------------------------------------------------------

// The reference's folder and outputs, made once for the suite (status 3: diffusers missing).
class Wan22VAEDiffusers : public Wan22VAETest {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("wan22_vae_diffusers");
    made_ = test::run_process(test::python() + " " + test::reference_script("diffusers_vae22_reference.py") + " " +
                              dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    Wan22VAETest::SetUp();
    if (made_.status == 3) GTEST_SKIP() << made_.output;
    ASSERT_EQ(made_.status, 0) << made_.output;
  }
  static ScratchDir* dir_;
  static test::ProcessResult made_;
};
ScratchDir* Wan22VAEDiffusers::dir_ = nullptr;
test::ProcessResult Wan22VAEDiffusers::made_;

TEST_F(Wan22VAEDiffusers, EncodeAndDecodeEqualDiffusers) {
  const TensorMap io = load_safetensors(*dir_ / "io.safetensors");
  Wan22VAE vae = open_wan22_vae(*dir_ / "vae");
  EXPECT_EQ(vae->cfg.base_dim, 8);
  EXPECT_EQ(vae->cfg.decoder_base_dim, 16);
  EXPECT_EQ(vae->cfg.z_dim, 8);
  EXPECT_EQ(vae->cfg.patch_size, 2);
  at::NoGradGuard ng;
  for (const VaeRunOptions& opts : {VaeRunOptions{}, whole_clip()}) {
    const std::string run = opts.chunked ? "chunked" : "whole clip";
    const VaeMoments m = vae->encode(io.at("video"), opts);
    const at::Tensor raw = vae->decode_raw(io.at("mean"), opts);
    const std::vector<std::pair<std::string, at::Tensor>> ours = {
        {"mean", m.mean},
        {"logvar", m.logvar},
        {"latents", vae->encode_latents(io.at("video"), opts)},
        {"decoded_raw", raw},
        {"decoded", vae->decode(io.at("mean"), opts)}};
    for (const auto& [name, t] : ours) {
      const at::Tensor& ref = io.at(name);
      ASSERT_EQ(t.sizes(), ref.sizes()) << run << " " << name;
      const double dev = relative_deviation(t, ref);
      std::printf("[ diffusers ] %-10s %-11s max |ours - diffusers| / max |diffusers| = %.3g\n", run.c_str(),
                  name.c_str(), dev);
      EXPECT_LE(dev, 1e-4) << run << " " << name;
    }
  }
  // Tiled as diffusers' enable_tiling(32, 32, 16, 16) tiles and blends.
  VaeRunOptions tiled;
  tiled.tiling.enabled = true, tiled.tiling.tile = 32, tiled.tiling.stride = 16;
  for (const auto& [name, t] : std::vector<std::pair<std::string, at::Tensor>>{
           {"tiled_mean", vae->encode(io.at("video").narrow(0, 0, 1), tiled).mean},
           {"tiled_decoded", vae->decode(io.at("mean").narrow(0, 0, 1), tiled)}}) {
    const at::Tensor& ref = io.at(name);
    ASSERT_EQ(t.sizes(), ref.sizes()) << name;
    const double dev = relative_deviation(t, ref);
    std::printf("[ diffusers ] tiled      %-11s max |ours - diffusers| / max |diffusers| = %.3g\n", name.c_str(), dev);
    EXPECT_LE(dev, 1e-4) << name;
  }
  // The raw decode goes beyond [-1, 1], so the clamped comparison is not the raw one twice.
  EXPECT_GT(io.at("decoded_raw").abs().max().item<double>(), 1.0);
  // The pipeline folder around vae/ and the weights file beside config.json find the same VAE.
  std::ofstream(*dir_ / "model_index.json") << R"({"_class_name": "WanPipeline"})";
  for (const std::string& path : {dir_->path(), *dir_ / "vae/diffusion_pytorch_model.safetensors"}) {
    Wan22VAE again = open_wan22_vae(path);
    const std::string key = "decoder.conv_out.weight";
    EXPECT_TRUE(at::equal(state_dict(*again).at(key), state_dict(*vae).at(key))) << path;
  }
  fs::remove(*dir_ / "model_index.json");
}

TEST_F(Wan22VAEDiffusers, ConfigThatIsNotAWan22VaeIsNamed) {
  ScratchDir scratch("wan22_vae_config");
  const std::string vae_dir = scratch / "vae", config = vae_dir + "/config.json";
  fs::copy(*dir_ / "vae", vae_dir, fs::copy_options::recursive);
  nlohmann::json good;
  {
    std::ifstream in(config);
    in >> good;
  }
  // Each edit of the good config, and what the refusal must say (always with the file's path).
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    std::ofstream(config) << j.dump(2);
    const std::string m = message_of([&] { open_wan22_vae(vae_dir); });
    EXPECT_MESSAGE_HAS(m, needle);
    EXPECT_MESSAGE_HAS(m, config);
  };
  refused([](auto& j) { j["is_residual"] = false; }, "is_residual is false, which is the Wan 2.1 VAE");
  refused([](auto& j) { j.erase("is_residual"); }, "is_residual is not set");
  refused([](auto& j) { j["patch_size"] = 1; }, "patch_size is 1");
  refused([](auto& j) { j.erase("patch_size"); }, "patch_size is not set");
  refused([](auto& j) { j["z_dim"] = 16; }, "z_dim is 16 but latents_mean has 8");
  refused([](auto& j) { j["in_channels"] = 3; }, "in_channels is 3");
  refused([](auto& j) { j["scale_factor_spatial"] = 8; }, "scale_factor_spatial 8 disagree");
  refused([](auto& j) { j["attn_scales"] = {0.5}; }, "attn_scales");
  refused([](auto& j) { j["temperal_downsample"] = {true, true}; }, "temporal_downsample needs 3 entries");
  refused([](auto& j) { j["shift_factor"] = 0.1; }, "key 'shift_factor'");
  refused([](auto& j) { j["base_dim"] = "8"; }, "'base_dim' must be an integer");
  // A config of another z_dim than the weights: the weights' keys are named, and the config.
  refused(
      [](auto& j) {
        j["z_dim"] = 16;
        j["latents_mean"] = std::vector<double>(16, 0.0);
        j["latents_std"] = std::vector<double>(16, 1.0);
      },
      "mis-shaped key(s): ");
  // diffusers' Wan 2.2 conversion writes clip_output, which diffusers now ignores: so do we.
  nlohmann::json j = good;
  j["clip_output"] = false;
  std::ofstream(config) << j.dump(2);
  EXPECT_EQ(open_wan22_vae(vae_dir)->cfg.z_dim, 8);
  // Another model's folder is named by find_vae_files.
  j = good;
  j["_class_name"] = "WanTransformer3DModel";
  std::ofstream(config) << j.dump(2);
  EXPECT_MESSAGE_HAS(message_of([&] { open_wan22_vae(vae_dir); }), "holds a model of class 'WanTransformer3DModel'");
  // Weights without config.json cannot say their shape.
  fs::remove(config);
  EXPECT_MESSAGE_HAS(message_of([&] { open_wan22_vae(vae_dir); }), "no diffusers config.json");
}

}  // namespace
}  // namespace vidit
