// The CLIP image encoder against transformers' CLIPVisionModel (tests/reference/
// clip_vision_reference.py): every hidden state and the pooled output, for a small config, a
// gelu_new config and ViT-H/14's layer shape; the layouts a checkpoint comes in (hub names,
// transformers 5's bare names, shards, a CLIPConfig, a pipeline folder, a lone file); bf16; the
// errors.
#include "vision/clip_vision.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "vision/vision_test_util.h"

namespace fs = std::filesystem;

namespace vidit::vision {
namespace {

using test::relative_error;
using vidit::test::message_of;
using vidit::test::ScratchDir;

// Loads `name` from the reference and compares every hidden state and the pooled output with
// transformers' (relative error, max |a - b| / max |b|).
void expect_equals_transformers(const std::string& dir, const std::string& name, double tolerance) {
  const TensorMap io = load_safetensors(dir + "/" + name + "_io.safetensors");
  const ClipVisionEncoder enc = ClipVisionEncoder::load(dir + "/" + name, at::kFloat, at::kCPU);
  const ClipVisionOutput out = enc.forward(io.at("pixel_values"));
  ASSERT_EQ(static_cast<int64_t>(out.hidden_states.size()), enc.config().num_hidden_layers + 1);
  for (size_t i = 0; i < out.hidden_states.size(); ++i) {
    const at::Tensor& want = io.at("hidden." + std::to_string(i));
    ASSERT_EQ(out.hidden_states[i].sizes(), want.sizes()) << name << " hidden state " << i;
    EXPECT_EQ(out.hidden_states[i].scalar_type(), at::kFloat);
    EXPECT_LT(relative_error(out.hidden_states[i], want), tolerance) << name << " hidden state " << i;
  }
  ASSERT_EQ(out.pooled.sizes(), io.at("pooled").sizes());
  EXPECT_LT(relative_error(out.pooled, io.at("pooled")), tolerance) << name << " pooled";
  // The shortcuts run fewer layers and give the same values.
  EXPECT_TRUE(at::equal(enc.penultimate(io.at("pixel_values")), out.hidden_states[out.hidden_states.size() - 2]));
  EXPECT_TRUE(at::equal(enc.hidden_state(io.at("pixel_values"), 0), out.hidden_states[0]));
  EXPECT_TRUE(at::equal(enc.hidden_state(io.at("pixel_values"), -1), out.hidden_states.back()));
}

TEST(ClipVisionReference, SmallConfigEqualsTransformers) {
  VIDIT_CLIP_REFERENCE(dir);
  const ClipVisionEncoder enc = ClipVisionEncoder::load(dir + "/small", at::kFloat, at::kCPU);
  EXPECT_EQ(enc.config().num_hidden_layers, 3);
  EXPECT_EQ(enc.config().hidden_act, "quick_gelu");
  EXPECT_EQ(enc.config().tokens(), 17);
  expect_equals_transformers(dir, "small", 1e-5);
}

TEST(ClipVisionReference, GeluNewEqualsTransformers) {
  VIDIT_CLIP_REFERENCE(dir);
  EXPECT_EQ(ClipVisionConfig::from_json_file(dir + "/gelu_new/config.json").hidden_act, "gelu_new");
  expect_equals_transformers(dir, "gelu_new", 1e-5);
}

TEST(ClipVisionReference, VitHLayerShapeEqualsTransformers) {
  VIDIT_CLIP_REFERENCE(dir);
  const ClipVisionConfig cfg = ClipVisionConfig::from_json_file(dir + "/vit_h/config.json");
  EXPECT_EQ(cfg.hidden_size, 1280);
  EXPECT_EQ(cfg.num_attention_heads, 16);
  EXPECT_EQ(cfg.intermediate_size, 5120);
  EXPECT_EQ(cfg.hidden_act, "gelu");
  EXPECT_EQ(cfg.tokens(), 257);
  expect_equals_transformers(dir, "vit_h", 1e-5);
  // What Wan 2.1 I2V takes: 257 tokens of 1280.
  const TensorMap io = load_safetensors(dir + "/vit_h_io.safetensors");
  const at::Tensor tokens =
      ClipVisionEncoder::load(dir + "/vit_h", at::kFloat, at::kCPU).penultimate(io.at("pixel_values"));
  EXPECT_EQ(tokens.sizes(), (std::vector<int64_t>{1, 257, 1280}));
  EXPECT_LT(relative_error(tokens, io.at("hidden.1")), 1e-5);
}

TEST(ClipVisionReference, EveryLayoutLoadsTheSameWeights) {
  VIDIT_CLIP_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const at::Tensor want = ClipVisionEncoder::load(dir + "/small", at::kFloat, at::kCPU).forward(io.at("pixel_values")).pooled;
  ASSERT_TRUE(fs::exists(dir + "/small_sharded/model-00003-of-00003.safetensors"));
  // transformers 5's names, shards, a CLIPConfig (fields at their defaults left out) with another
  // tower's tensors beside, a pipeline root, the weight file itself (config.json beside it).
  for (const std::string& p : {dir + "/small_bare", dir + "/small_sharded", dir + "/small_clip", dir + "/pipe",
                              dir + "/small/model.safetensors"}) {
    const ClipVisionEncoder enc = ClipVisionEncoder::load(p, at::kFloat, at::kCPU);
    EXPECT_EQ(enc.config().num_channels, 3) << p;
    EXPECT_EQ(enc.config().layer_norm_eps, 1e-5) << p;
    EXPECT_TRUE(at::equal(enc.forward(io.at("pixel_values")).pooled, want)) << p;
  }
}

TEST(ClipVisionReference, Bf16StaysCloseToFp32) {
  VIDIT_CLIP_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/small_io.safetensors");
  const ClipVisionEncoder enc = ClipVisionEncoder::load(dir + "/small", at::kBFloat16, at::kCPU);
  EXPECT_EQ(enc.dtype(), at::kBFloat16);
  const ClipVisionOutput out = enc.forward(io.at("pixel_values"));
  for (size_t i = 0; i < out.hidden_states.size(); ++i) {
    EXPECT_EQ(out.hidden_states[i].scalar_type(), at::kFloat);
    EXPECT_LT(relative_error(out.hidden_states[i], io.at("hidden." + std::to_string(i))), 1e-2) << i;  // ~4e-3
  }
  EXPECT_LT(relative_error(out.pooled, io.at("pooled")), 1e-2);
}

TEST(ClipVisionReference, CudaEqualsCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  VIDIT_CLIP_REFERENCE(dir);
  const TensorMap io = load_safetensors(dir + "/vit_h_io.safetensors");
  const ClipVisionEncoder enc = ClipVisionEncoder::load(dir + "/vit_h", at::kFloat, at::Device(at::kCUDA, 0));
  const std::vector<at::Tensor> h = enc.hidden_states(io.at("pixel_values"));
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_TRUE(h[i].is_cuda());
    // TF32 matmuls on Ampere and later are allowed to round more than the CPU's fp32.
    EXPECT_LT(relative_error(h[i].cpu(), io.at("hidden." + std::to_string(i))), 5e-3) << i;
  }
  const ClipVisionEncoder bf16 = ClipVisionEncoder::load(dir + "/vit_h", at::kBFloat16, at::Device(at::kCUDA, 0));
  EXPECT_LT(relative_error(bf16.penultimate(io.at("pixel_values")).cpu(), io.at("hidden.1")), 3e-2);
}

TEST(ClipVisionReference, ShapeMismatchNamesTheTensor) {
  VIDIT_CLIP_REFERENCE(dir);
  ScratchDir tmp("clip_shape");
  fs::copy(dir + "/small", tmp.path(), fs::copy_options::recursive);
  std::ifstream cfg_in(tmp / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  cfg_in.close();
  cfg["intermediate_size"] = 128;
  std::ofstream(tmp / "config.json") << cfg.dump();
  const std::string msg = message_of([&] { ClipVisionEncoder::load(tmp.path(), at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("vision_model.encoder.layers.0.mlp.fc1.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[96, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [128, 64]"), std::string::npos) << msg;
}

TEST(ClipVisionReference, LayerMissingFromEveryShardIsNamed) {
  VIDIT_CLIP_REFERENCE(dir);
  ScratchDir tmp("clip_missing");
  fs::copy(dir + "/small_sharded", tmp.path(), fs::copy_options::recursive);
  std::ifstream cfg_in(tmp / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  cfg_in.close();
  cfg["num_hidden_layers"] = 4;
  std::ofstream(tmp / "config.json") << cfg.dump();
  const std::string msg = message_of([&] { ClipVisionEncoder::load(tmp.path(), at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("encoder.layers.3."), std::string::npos) << msg;
  EXPECT_NE(msg.find("none of the 3 shards"), std::string::npos) << msg;
}

TEST(ClipVisionReference, WrongInputsAreRefused) {
  VIDIT_CLIP_REFERENCE(dir);
  const ClipVisionEncoder enc = ClipVisionEncoder::load(dir + "/small", at::kFloat, at::kCPU);
  std::string msg = message_of([&] { enc.forward(at::zeros({1, 3, 64, 64})); });
  EXPECT_NE(msg.find("[B, 3, 32, 32]"), std::string::npos) << msg;
  msg = message_of([&] { enc.forward(at::zeros({1, 3, 32, 32}, at::kByte)); });
  EXPECT_NE(msg.find("floating point"), std::string::npos) << msg;
  msg = message_of([&] { enc.hidden_state(at::zeros({1, 3, 32, 32}), 4); });
  EXPECT_NE(msg.find("has 4"), std::string::npos) << msg;
  // A lone weight file with no config.json beside it.
  ScratchDir tmp("clip_lone");
  fs::copy_file(dir + "/small/model.safetensors", tmp / "image_encoder.safetensors");
  msg = message_of([&] { ClipVisionEncoder::load(tmp / "image_encoder.safetensors", at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find("no config.json"), std::string::npos) << msg;
}

TEST(ClipVisionConfig, ReadsVisionAndClipConfigs) {
  ScratchDir tmp("clip_cfg");
  std::ofstream(tmp / "vision.json") << R"({"model_type": "clip_vision_model", "hidden_size": 1280,
      "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16, "patch_size": 14,
      "image_size": 224, "hidden_act": "gelu", "layer_norm_eps": 1e-05, "projection_dim": 1024})";
  const ClipVisionConfig h = ClipVisionConfig::from_json_file(tmp / "vision.json");
  EXPECT_EQ(h.hidden_size, 1280);
  EXPECT_EQ(h.num_hidden_layers, 32);
  EXPECT_EQ(h.head_dim(), 80);
  EXPECT_EQ(h.grid(), 16);
  EXPECT_EQ(h.tokens(), 257);
  EXPECT_EQ(h.num_channels, 3);  // transformers' default
  // A CLIPConfig: the vision tower's fields in vision_config, the rest at transformers' defaults.
  std::ofstream(tmp / "clip.json") << R"({"model_type": "clip", "text_config": {"hidden_size": 512},
      "vision_config": {"hidden_size": 1024, "num_attention_heads": 16, "patch_size": 14}})";
  const ClipVisionConfig c = ClipVisionConfig::from_json_file(tmp / "clip.json");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.image_size, 224);
  EXPECT_EQ(c.hidden_act, "quick_gelu");
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
}

TEST(ClipVisionConfig, BadFieldsAreNamed) {
  ScratchDir tmp("clip_cfg_bad");
  auto error_for = [&](const std::string& text) {
    std::ofstream(tmp / "config.json") << text;
    return message_of([&] { ClipVisionConfig::from_json_file(tmp / "config.json"); });
  };
  std::string msg = error_for(R"({"hidden_size": 100, "num_attention_heads": 16})");
  EXPECT_NE(msg.find("not a multiple of num_attention_heads"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp / "config.json"), std::string::npos) << msg;
  msg = error_for(R"({"model_type": "siglip_vision_model"})");
  EXPECT_NE(msg.find("siglip_vision_model"), std::string::npos) << msg;
  msg = error_for(R"({"vision_config": {"patch_size": -3}})");
  EXPECT_NE(msg.find("vision_config.patch_size"), std::string::npos) << msg;
  msg = error_for(R"({"hidden_act": "relu"})");
  EXPECT_NE(msg.find("hidden_act \"relu\""), std::string::npos) << msg;
  msg = error_for("{not json");
  EXPECT_NE(msg.find("cannot read it as JSON"), std::string::npos) << msg;
  msg = message_of([&] { ClipVisionEncoder::load(tmp / "absent", at::kFloat, at::kCPU); });
  EXPECT_NE(msg.find(tmp / "absent"), std::string::npos) << msg;
  fs::remove(tmp / "config.json");
  msg = message_of([&] { ClipVisionEncoder::load(tmp.path(), at::kFloat, at::kCPU); });  // empty folder
  EXPECT_NE(msg.find("no model.safetensors"), std::string::npos) << msg;
}

}  // namespace
}  // namespace vidit::vision
