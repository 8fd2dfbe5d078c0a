// The Wan 2.1 VAE's two weight layouts (official, diffusers' AutoencoderKLWan): names both ways,
// finding the VAE from a file / vae/ folder / pipeline folder, config checks, and equality of our
// encode and decode with diffusers' own AutoencoderKLWan on its saved folder
// (tests/reference/diffusers_vae_reference.py, run with the project's Python; skipped where it or
// diffusers is missing). (`--weights PIPELINE` finding its vae/ is in pipeline/wan_weights_test.cpp.)
#include "vae/vae_layout.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "model/state_dict.h"
#include "vae/wan_vae.h"
#include "vae/vae_test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using test::ScratchDir;

using test::random_vae;
using test::tiny_vae_config;

using test::message_of;

#define EXPECT_MESSAGE_HAS(message, needle) \
  EXPECT_NE((message).find(needle), std::string::npos) << "no '" << (needle) << "' in: " << (message)

// max |a - b| / max |b|
double relative_deviation(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.abs().max().item<double>();
}

using VaeLayoutTest = test::OneThreadTest;

TEST_F(VaeLayoutTest, NamesMapOneToOneAsDiffusersConvertsTheRelease) {
  const std::vector<VaeParam> params = vae_params(WanVAEConfig{});
  ASSERT_EQ(params.size(), 194u);  // the release's key count, in both layouts
  std::map<std::string, std::string> to_diffusers;
  std::set<std::string> diffusers_names;
  for (const auto& p : params) {
    to_diffusers[p.official] = p.diffusers;
    diffusers_names.insert(p.diffusers);
  }
  EXPECT_EQ(diffusers_names.size(), params.size()) << "two official names map to one diffusers name";
  // Pairs as diffusers' own converter (convert_wan_vae_to_diffusers) and its AutoencoderKLWan name them.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"conv1.weight", "quant_conv.weight"},
      {"conv2.bias", "post_quant_conv.bias"},
      {"encoder.conv1.weight", "encoder.conv_in.weight"},
      {"encoder.downsamples.0.residual.0.gamma", "encoder.down_blocks.0.norm1.gamma"},
      {"encoder.downsamples.0.residual.2.weight", "encoder.down_blocks.0.conv1.weight"},
      {"encoder.downsamples.1.residual.3.gamma", "encoder.down_blocks.1.norm2.gamma"},
      {"encoder.downsamples.1.residual.6.bias", "encoder.down_blocks.1.conv2.bias"},
      {"encoder.downsamples.2.resample.1.weight", "encoder.down_blocks.2.resample.1.weight"},
      {"encoder.downsamples.3.shortcut.weight", "encoder.down_blocks.3.conv_shortcut.weight"},
      {"encoder.downsamples.5.time_conv.weight", "encoder.down_blocks.5.time_conv.weight"},
      {"encoder.middle.0.residual.2.weight", "encoder.mid_block.resnets.0.conv1.weight"},
      {"encoder.middle.1.norm.gamma", "encoder.mid_block.attentions.0.norm.gamma"},
      {"encoder.middle.1.to_qkv.weight", "encoder.mid_block.attentions.0.to_qkv.weight"},
      {"encoder.middle.2.residual.6.bias", "encoder.mid_block.resnets.1.conv2.bias"},
      {"encoder.head.0.gamma", "encoder.norm_out.gamma"},
      {"encoder.head.2.weight", "encoder.conv_out.weight"},
      {"decoder.conv1.bias", "decoder.conv_in.bias"},
      {"decoder.middle.1.proj.weight", "decoder.mid_block.attentions.0.proj.weight"},
      {"decoder.upsamples.0.residual.0.gamma", "decoder.up_blocks.0.resnets.0.norm1.gamma"},
      {"decoder.upsamples.2.residual.6.weight", "decoder.up_blocks.0.resnets.2.conv2.weight"},
      {"decoder.upsamples.3.time_conv.weight", "decoder.up_blocks.0.upsamplers.0.time_conv.weight"},
      {"decoder.upsamples.3.resample.1.weight", "decoder.up_blocks.0.upsamplers.0.resample.1.weight"},
      {"decoder.upsamples.4.shortcut.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight"},
      {"decoder.upsamples.7.time_conv.bias", "decoder.up_blocks.1.upsamplers.0.time_conv.bias"},
      {"decoder.upsamples.11.resample.1.weight", "decoder.up_blocks.2.upsamplers.0.resample.1.weight"},
      {"decoder.upsamples.12.residual.0.gamma", "decoder.up_blocks.3.resnets.0.norm1.gamma"},
      {"decoder.upsamples.14.residual.6.weight", "decoder.up_blocks.3.resnets.2.conv2.weight"},
      {"decoder.head.0.gamma", "decoder.norm_out.gamma"},
      {"decoder.head.2.bias", "decoder.conv_out.bias"},
  };
  for (const auto& [official, diffusers] : expected) {
    ASSERT_TRUE(to_diffusers.count(official)) << official;
    EXPECT_EQ(to_diffusers.at(official), diffusers) << official;
  }
  // The decoder's regrouping follows num_res_blocks: with 1, a stage is 2 residual blocks + 1 resample.
  WanVAEConfig one = tiny_vae_config();
  one.num_res_blocks = 1;
  std::map<std::string, std::string> m1;
  for (const auto& p : vae_params(one)) m1[p.official] = p.diffusers;
  EXPECT_EQ(m1.at("decoder.upsamples.2.time_conv.weight"), "decoder.up_blocks.0.upsamplers.0.time_conv.weight");
  EXPECT_EQ(m1.at("decoder.upsamples.3.residual.0.gamma"), "decoder.up_blocks.1.resnets.0.norm1.gamma");
  EXPECT_EQ(m1.at("decoder.upsamples.10.residual.6.bias"), "decoder.up_blocks.3.resnets.1.conv2.bias");
}

TEST_F(VaeLayoutTest, EitherLayoutLoadsTheSameWeightsAndBadKeysAreNamed) {
  const WanVAEConfig cfg = tiny_vae_config();
  WanVAE src = random_vae(cfg, 5);
  const TensorMap official = state_dict(*src);
  const TensorMap diffusers = vae_to_diffusers_names(official, cfg, "x");
  EXPECT_EQ(vae_layout_of(official, "x"), VaeLayout::wan);
  EXPECT_EQ(vae_layout_of(diffusers, "x"), VaeLayout::diffusers);
  ASSERT_TRUE(diffusers.count("decoder.up_blocks.1.upsamplers.0.time_conv.weight"));
  // Renaming back gives every tensor under its own name again.
  const TensorMap back = vae_to_official_names(diffusers, cfg, "x");
  ASSERT_EQ(back.size(), official.size());
  for (const auto& [k, v] : official) EXPECT_TRUE(back.count(k) && back.at(k).is_same(v)) << k;

  WanVAE dst = random_vae(cfg, 6);
  load_wan_vae(*dst, diffusers, "vae/diffusion_pytorch_model.safetensors");
  for (const auto& [k, v] : state_dict(*dst)) EXPECT_TRUE(at::equal(v, official.at(k))) << k;

  auto expect_error = [&](const TensorMap& sd, const std::string& needle) {
    WanVAE fresh = random_vae(cfg, 7);
    const TensorMap before = state_dict(*fresh);
    const std::string m = message_of([&] { load_wan_vae(*fresh, sd, "vae/diffusion_pytorch_model.safetensors"); });
    EXPECT_MESSAGE_HAS(m, needle);
    EXPECT_MESSAGE_HAS(m, "vae/diffusion_pytorch_model.safetensors");
    for (const auto& [k, v] : state_dict(*fresh)) EXPECT_TRUE(at::equal(v, before.at(k))) << "written: " << k;
  };
  TensorMap unknown = diffusers;
  unknown["decoder.up_blocks.3.upsamplers.0.time_conv.weight"] = at::zeros({16, 8, 3, 1, 1});
  expect_error(unknown, "unexpected key(s): decoder.up_blocks.3.upsamplers.0.time_conv.weight");
  TensorMap missing = diffusers;
  missing.erase("encoder.mid_block.attentions.0.proj.bias");
  expect_error(missing, "missing key(s): encoder.mid_block.attentions.0.proj.bias");
  TensorMap misshaped = diffusers;
  misshaped["post_quant_conv.weight"] = at::zeros({8, 8, 1, 1, 1});
  expect_error(misshaped, "mis-shaped key(s): post_quant_conv.weight");
  TensorMap mixed = diffusers;
  mixed["encoder.conv1.weight"] = official.at("encoder.conv1.weight");
  expect_error(mixed, "mix the official Wan VAE names");
  // A diffusers VAE of another width: the shapes disagree, named in diffusers' names.
  WanVAEConfig wider = cfg;
  wider.base_dim = 16;
  expect_error(vae_to_diffusers_names(state_dict(*random_vae(wider, 1)), wider, "x"), "mis-shaped key(s): ");
}

// Writes `j` as `dir`/config.json.
void write_config(const std::string& dir, const nlohmann::json& j) { std::ofstream(dir + "/config.json") << j.dump(2); }

TEST_F(VaeLayoutTest, FindsTheVaeFromAFileAVaeFolderOrAPipelineFolder) {
  ScratchDir dir("vae_layout_find");
  const WanVAEConfig cfg = tiny_vae_config();
  WanVAE src = random_vae(cfg, 8);
  const std::string pipe = dir / "pipe";
  write_diffusers_vae(state_dict(*src), cfg, pipe + "/vae");
  std::ofstream(pipe + "/model_index.json") << R"({"_class_name": "WanPipeline"})";
  const std::string file = pipe + "/vae/diffusion_pytorch_model.safetensors";
  for (const std::string& path : {pipe, pipe + "/vae", pipe + "/vae/", file}) {
    SCOPED_TRACE(path);
    const VaeFiles f = find_vae_files(path);
    EXPECT_EQ(fs::path(f.weights).lexically_normal(), fs::path(file).lexically_normal());
    EXPECT_EQ(fs::path(f.config).lexically_normal(), fs::path(pipe + "/vae/config.json").lexically_normal());
    WanVAE dst = random_vae(cfg, 9);
    load_wan_vae(*dst, path);
    for (const auto& [k, v] : state_dict(*dst)) EXPECT_TRUE(at::equal(v, state_dict(*src).at(k))) << k;
  }
  // An official release folder: Wan2.1_VAE.safetensors beside the transformer's config.json.
  const std::string release = dir / "release";
  fs::create_directories(release);
  save_safetensors(release + "/Wan2.1_VAE.safetensors", state_dict(*src));
  write_config(release, {{"_class_name", "WanModel"}, {"dim", 1536}});
  EXPECT_EQ(find_vae_files(release).weights, release + "/Wan2.1_VAE.safetensors");
  EXPECT_EQ(find_vae_files(release + "/Wan2.1_VAE.safetensors").config, "");  // WanModel's config is not the VAE's
  WanVAE dst = random_vae(cfg, 10);
  load_wan_vae(*dst, release);
  EXPECT_TRUE(at::equal(state_dict(*dst).at("decoder.head.2.weight"), state_dict(*src).at("decoder.head.2.weight")));

  // What cannot be read is named, with what to do.
  std::string m = message_of([&] { find_vae_files(dir / "nothing"); });
  EXPECT_MESSAGE_HAS(m, "nothing' do not exist");
  std::ofstream(dir / "Wan2.1_VAE.pth") << "pickle";
  m = message_of([&] { find_vae_files(dir / "Wan2.1_VAE.pth"); });
  EXPECT_MESSAGE_HAS(m, "a pickle");
  EXPECT_MESSAGE_HAS(m, "s.save_file");
  const std::string transformer = dir / "transformer";
  fs::create_directories(transformer);
  std::ofstream(transformer + "/diffusion_pytorch_model.safetensors") << "x";
  write_config(transformer, {{"_class_name", "WanTransformer3DModel"}});
  m = message_of([&] { find_vae_files(transformer); });
  EXPECT_MESSAGE_HAS(m, "holds a model of class 'WanTransformer3DModel'");
  const std::string bare = dir / "bare_pipe";
  fs::create_directories(bare + "/vae");
  std::ofstream(bare + "/model_index.json") << "{}";
  m = message_of([&] { find_vae_files(bare); });
  EXPECT_MESSAGE_HAS(m, "has no diffusion_pytorch_model.safetensors");
}

TEST_F(VaeLayoutTest, ConfigJsonIsCheckedAgainstTheVaeBuilt) {
  ScratchDir dir("vae_layout_config");
  const WanVAEConfig cfg = tiny_vae_config();
  const std::string vae_dir = dir / "vae";
  write_diffusers_vae(state_dict(*random_vae(cfg, 11)), cfg, vae_dir);
  const std::string config = vae_dir + "/config.json";
  const WanVAEConfig read = vae_config_from_diffusers(config);
  EXPECT_EQ(read.base_dim, 8);
  EXPECT_EQ(read.z_dim, 16);
  EXPECT_EQ(read.dim_mult, (std::vector<int64_t>{1, 2, 4, 4}));
  EXPECT_EQ(read.temporal_downsample, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(read.latent_std, cfg.latent_std);

  std::ifstream in(config);
  const nlohmann::json good = nlohmann::json::parse(in);
  // Each edit of a good config, and what the refusal must say.
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    write_config(vae_dir, j);
    WanVAE vae = random_vae(cfg, 12);
    const std::string m = message_of([&] { load_wan_vae(*vae, vae_dir); });
    EXPECT_MESSAGE_HAS(m, needle);
    EXPECT_MESSAGE_HAS(m, config);
  };
  refused([](auto& j) { j["base_dim"] = 96; }, "base_dim is 96 but the WanVAE being loaded has 8");
  refused([](auto& j) { j["num_res_blocks"] = 3; }, "num_res_blocks is 3");
  refused([](auto& j) { j["temperal_downsample"] = {true, true, false}; }, "temperal_downsample is [true, true, false]");
  refused([](auto& j) { j["latents_mean"][3] = 0.5; }, "latents_mean is [");
  refused([](auto& j) { j["is_residual"] = true; }, "Wan 2.2's VAE");
  refused([](auto& j) { j["patch_size"] = 2; }, "Wan 2.2's VAE");
  refused([](auto& j) { j["attn_scales"] = {0.5}; }, "attn_scales");
  refused([](auto& j) { j["decoder_base_dim"] = 16; }, "decoder_base_dim 16 differs");
  refused([](auto& j) { j["scale_factor_spatial"] = 16; }, "scale_factor_spatial 16 disagree");
  refused([](auto& j) { j["z_dim"] = "16"; }, "'z_dim' must be an integer");
  refused([](auto& j) { j["shift_factor"] = 0.1; }, "key 'shift_factor'");
  refused([](auto& j) { j["_class_name"] = "AutoencoderKL"; }, "class 'AutoencoderKL'");
  // Left out, a key takes AutoencoderKLWan's default (Wan 2.1's): base_dim 96 then differs.
  refused([](auto& j) { j.erase("base_dim"); }, "base_dim is 96");
  nlohmann::json j = good;
  j["_class_name"] = "WanTransformer3DModel";
  write_config(vae_dir, j);
  EXPECT_MESSAGE_HAS(message_of([&] { vae_config_from_diffusers(config); }),
                     "describes a model of class 'WanTransformer3DModel', not diffusers' AutoencoderKLWan");
  // dropout has no parameters and no effect in eval mode: accepted.
  j = good;
  j["dropout"] = 0.1;
  write_config(vae_dir, j);
  WanVAE vae = random_vae(cfg, 13);
  load_wan_vae(*vae, vae_dir);
  // Without config.json the names and shapes alone decide.
  fs::remove(config);
  EXPECT_EQ(find_vae_files(vae_dir).config, "");
  load_wan_vae(*vae, vae_dir);
  WanVAEConfig wider = cfg;
  wider.base_dim = 16;
  EXPECT_MESSAGE_HAS(message_of([&] { load_wan_vae(*random_vae(wider, 1), vae_dir); }), "mis-shaped key(s): ");
}

// ---- against diffusers ---------------------------------------------------------------------------
struct Ran {
  int status;
  std::string output;
};

Ran run_reference(const std::string& args) {
  const std::string command = std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR +
                              "/tests/reference/diffusers_vae_reference.py " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed: " + command};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int st = pclose(pipe);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The reference's folder and outputs, made once for the suite (status 3: diffusers missing).
class VaeLayoutDiffusers : public VaeLayoutTest {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("vae_layout_diffusers");
    made_ = run_reference("make " + dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    VaeLayoutTest::SetUp();
    if (made_.status == 3) GTEST_SKIP() << made_.output;
    ASSERT_EQ(made_.status, 0) << made_.output;
  }
  static ScratchDir* dir_;
  static Ran made_;
};
ScratchDir* VaeLayoutDiffusers::dir_ = nullptr;
Ran VaeLayoutDiffusers::made_;

// Our encode (posterior mean, logvar) and decode (raw, and clamped as diffusers returns it) of
// `vae` against the reference's outputs `theirs` on the inputs of `io`; returns the largest deviation.
double compare_with(WanVAEImpl& vae, const TensorMap& io, const TensorMap& theirs, const std::string& what) {
  at::NoGradGuard ng;
  vae.eval();
  const VaeMoments m = vae.encode(io.at("video"));
  const at::Tensor decoded = vae.decode(io.at("z"));
  double worst = 0;
  for (const auto& [name, ours] : std::vector<std::pair<std::string, at::Tensor>>{
           {"mean", m.mean}, {"logvar", m.logvar}, {"decoded_raw", decoded}, {"decoded", decoded.clamp(-1, 1)}}) {
    const at::Tensor& ref = theirs.at(name);
    EXPECT_EQ(ours.sizes(), ref.sizes()) << what << " " << name;
    if (ours.sizes() != ref.sizes()) return 1.0;
    const double dev = relative_deviation(ours, ref);
    std::printf("[ diffusers ] %s %-11s max |ours - diffusers| / max |diffusers| = %.3g\n", what.c_str(), name.c_str(), dev);
    EXPECT_LE(dev, 1e-4) << what << " " << name;
    worst = std::max(worst, dev);
  }
  // The raw decode goes beyond [-1, 1], so the clamped comparison is not the raw one twice.
  EXPECT_GT(theirs.at("decoded_raw").abs().max().item<double>(), 1.0);
  return worst;
}

TEST_F(VaeLayoutDiffusers, OurEncodeAndDecodeEqualDiffusersOnItsSavedFolder) {
  const TensorMap io = load_safetensors(*dir_ / "io.safetensors");
  // A pipeline root around the saved vae/.
  std::ofstream(*dir_ / "model_index.json") << R"({"_class_name": "WanPipeline"})";
  for (const std::string& path : {*dir_ / "vae", dir_->path()}) {
    SCOPED_TRACE(path);
    const VaeFiles files = find_vae_files(path);
    ASSERT_FALSE(files.config.empty());
    WanVAE vae(vae_config_from_diffusers(files.config));
    EXPECT_EQ(vae->cfg.base_dim, 8);
    load_wan_vae(*vae, path);
    compare_with(*vae, io, io, "saved folder");
  }
}

TEST_F(VaeLayoutDiffusers, WrittenFolderLoadsInDiffusersWithTheSameEncodeAndDecode) {
  const WanVAEConfig cfg = tiny_vae_config();
  WanVAE vae = random_vae(cfg, 14);
  const std::string out = *dir_ / "written";
  write_diffusers_vae(state_dict(*vae), cfg, out);
  const Ran r = run_reference("run " + out + " " + (*dir_ / "io.safetensors") + " " + (*dir_ / "written_out.safetensors"));
  ASSERT_EQ(r.status, 0) << r.output;
  compare_with(*vae, load_safetensors(*dir_ / "io.safetensors"), load_safetensors(*dir_ / "written_out.safetensors"),
               "written folder");
}

}  // namespace
}  // namespace vidit
