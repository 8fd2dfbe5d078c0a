// The official Wan and diffusers weight layouts: names both ways, reading, writing, and equality
// with diffusers' own WanTransformer3DModel (tests/reference/diffusers_wan_reference.py, run with
// the project's Python; skipped where it or diffusers is missing).
#include "model/weight_layout.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;

// ---- helpers -------------------------------------------------------------------------------------
struct Ran {
  int status;
  std::string output;
};

Ran run(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int st = pclose(pipe);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string python() {
#ifdef VIDIT_PYTHON
  return VIDIT_PYTHON;
#else
  return "python3";
#endif
}

std::string reference_script() {
#ifdef VIDIT_SOURCE_DIR
  return std::string(VIDIT_SOURCE_DIR) + "/tests/reference/diffusers_wan_reference.py";
#else
  return "tests/reference/diffusers_wan_reference.py";
#endif
}

// Why the Python reference cannot run here, or "" when it can (asked once).
const std::string& reference_missing() {
  static const std::string why = [] {
    const Ran r = run(python() + " -c 'import torch, diffusers, safetensors'");
    if (r.status == 0) return std::string();
    return python() + " cannot import torch, diffusers and safetensors (scripts/requirements-test.txt): " +
           r.output.substr(r.output.size() > 300 ? r.output.size() - 300 : 0);
  }();
  return why;
}

using test::message_of;

// max |a - b| / max |b|
double relative_deviation(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.abs().max().item<double>();
}

// Every parameter moved off its initial value (zero biases, unit norms, a zero head), so a
// tensor that reaches the wrong place changes the output.
void perturb(DiT& model, uint64_t seed) {
  torch::NoGradGuard ng;
  at::manual_seed(seed);
  for (auto& p : model->parameters()) p.add_(0.1 * at::randn_like(p));
}

// A Wan-shaped model small enough for a test: 3 heads of 32, RoPE theta 10000 (what both layouts'
// models use), 4 -> 8 channels.
ModelConfig small_wan_config() {
  ModelConfig m = test::tiny_config().model;
  m.dim = 96, m.heads = 3, m.ffn_dim = 128, m.layers = 2, m.in_channels = 4, m.out_channels = 8;
  m.patch = {1, 2, 2}, m.text_dim = 32, m.text_len = 16, m.freq_dim = 64, m.eps = 1e-6, m.rope_theta = 10000.0;
  return m;
}

size_t count_files(const std::string& dir, const std::string& suffix) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    n += name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  return n;
}

// ---- names ---------------------------------------------------------------------------------------
TEST(WeightLayoutNames, EveryParameterMapsBothWaysAndShapesMatchTheModel) {
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  const auto shapes = transformer_shapes(cfg);
  const auto params = model->named_parameters(true);
  ASSERT_EQ(shapes.size(), params.size());
  std::set<std::string> diffusers;
  size_t i = 0;
  for (const auto& p : params) {
    EXPECT_EQ(shapes[i].first, p.key()) << "transformer_shapes() must list the model's parameters in order";
    EXPECT_EQ(shapes[i].second, p.value().sizes().vec()) << p.key();
    ++i;
    const std::string d = diffusers_name(p.key());
    EXPECT_TRUE(diffusers.insert(d).second) << d;
    EXPECT_EQ(official_name(d), p.key());
  }
  // A few rows spelled out: the ones whose names differ most.
  EXPECT_EQ(diffusers_name("blocks.1.norm3.weight"), "blocks.1.norm2.weight");
  EXPECT_EQ(diffusers_name("blocks.0.modulation"), "blocks.0.scale_shift_table");
  EXPECT_EQ(diffusers_name("head.modulation"), "scale_shift_table");
  EXPECT_EQ(diffusers_name("head.head.bias"), "proj_out.bias");
  EXPECT_EQ(diffusers_name("blocks.0.self_attn.o.weight"), "blocks.0.attn1.to_out.0.weight");
  EXPECT_EQ(diffusers_name("blocks.1.cross_attn.norm_k.weight"), "blocks.1.attn2.norm_k.weight");
  EXPECT_EQ(diffusers_name("blocks.0.ffn.0.bias"), "blocks.0.ffn.net.0.proj.bias");
  EXPECT_EQ(diffusers_name("time_projection.1.weight"), "condition_embedder.time_proj.weight");
  EXPECT_EQ(diffusers_name("text_embedding.2.weight"), "condition_embedder.text_embedder.linear_2.weight");
}

TEST(WeightLayoutNames, AKeyThatMapsToNothingIsNamed) {
  // (VACE's control blocks, and a LoRA tensor: no place in our DiT.)
  EXPECT_NE(message_of([] { official_name("vace_blocks.0.attn2.to_k.weight", "f.safetensors"); })
                .find("'vace_blocks.0.attn2.to_k.weight'"),
            std::string::npos);
  EXPECT_NE(message_of([] { diffusers_name("blocks.0.cross_attn.k.lora_A.weight"); })
                .find("'blocks.0.cross_attn.k.lora_A.weight'"),
            std::string::npos);
  // The image-to-video tensors map both ways.
  EXPECT_EQ(diffusers_name("img_emb.proj.0.weight"), "condition_embedder.image_embedder.norm1.weight");
  EXPECT_EQ(official_name("blocks.3.attn2.add_k_proj.bias", "f"), "blocks.3.cross_attn.k_img.bias");
  EXPECT_EQ(official_name("condition_embedder.image_embedder.pos_embed", "f"), "img_emb.emb_pos");
  EXPECT_THROW(diffusers_name("blocks.x.norm3.weight"), Error);
  EXPECT_THROW(diffusers_name("blocks.0.norm3.scale"), Error);
  TensorMap m = {{"proj_out.weight", at::zeros({2})}, {"condition_embedder.image_embedder.norm9.weight", at::zeros({2})}};
  const std::string msg = message_of([&] { to_official_names(m, "x.safetensors"); });
  EXPECT_NE(msg.find("condition_embedder.image_embedder.norm9.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("x.safetensors"), std::string::npos) << msg;
}

TEST(WeightLayoutNames, LayoutIsJudgedByNamesAndMixedNamesAreRefused) {
  EXPECT_EQ(layout_of_names({"patch_embedding.weight", "blocks.0.attn1.to_q.weight"}, "s"), WeightLayout::diffusers);
  EXPECT_EQ(layout_of_names({"patch_embedding.weight", "blocks.0.self_attn.q.weight"}, "s"), WeightLayout::wan);
  EXPECT_EQ(layout_of_names({"something.else"}, "s"), WeightLayout::wan);  // left for the strict loader
  const std::string msg =
      message_of([] { layout_of_names({"head.head.weight", "proj_out.weight"}, "mixed.safetensors"); });
  EXPECT_NE(msg.find("head.head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("proj_out.weight"), std::string::npos) << msg;
}

// ---- round trips in C++ ----------------------------------------------------------------------------
TEST(WeightLayoutRoundTrip, BothLayoutsReadBackBitwiseShardedOrNot) {
  test::ScratchDir dir("weight_layout_rt");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  model->init_weights();
  perturb(model, 3);
  const TensorMap official = state_dict(*model);
  struct Case {
    std::string name;
    WeightLayout layout;
    uint64_t shard;
  };
  for (const Case& c : {Case{"wan_sharded", WeightLayout::wan, 100'000}, Case{"wan_single", WeightLayout::wan, kDefaultMaxShardBytes},
                        Case{"diffusers_sharded", WeightLayout::diffusers, 100'000},
                        Case{"diffusers_single", WeightLayout::diffusers, kDefaultMaxShardBytes}}) {
    SCOPED_TRACE(c.name);
    const std::string out = dir / c.name;
    if (c.layout == WeightLayout::wan)
      write_wan_transformer(official, cfg, out, c.shard);
    else
      write_diffusers_transformer(official, cfg, out, c.shard);
    const bool sharded = c.shard < kDefaultMaxShardBytes;
    EXPECT_EQ(fs::exists(out + "/diffusion_pytorch_model.safetensors.index.json"), sharded);
    EXPECT_EQ(fs::exists(out + "/diffusion_pytorch_model.safetensors"), !sharded);
    if (sharded) {
      EXPECT_GT(count_files(out, ".safetensors"), 2u);
    }
    for (const auto& e : fs::directory_iterator(dir.path()))  // no temporary folder left behind
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();

    const WeightFiles files = find_transformer_weights(out);
    EXPECT_EQ(files.layout, c.layout);
    EXPECT_EQ(files.config, out + "/config.json");
    const TensorMap back = read_transformer_weights(out);
    ASSERT_EQ(back.size(), official.size());
    for (const auto& [k, v] : official) {
      ASSERT_TRUE(back.count(k)) << k;
      EXPECT_TRUE(at::equal(back.at(k), v)) << k;
    }
    // The config written describes the model again.
    const ModelConfig again = read_transformer_config(out);
    EXPECT_EQ(again.dim, cfg.dim);
    EXPECT_EQ(again.heads, cfg.heads);
    EXPECT_EQ(again.ffn_dim, cfg.ffn_dim);
    EXPECT_EQ(again.layers, cfg.layers);
    EXPECT_EQ(again.in_channels, cfg.in_channels);
    EXPECT_EQ(again.out_channels, cfg.out_channels);
    EXPECT_EQ(again.patch, cfg.patch);
    EXPECT_EQ(again.text_dim, cfg.text_dim);
    EXPECT_EQ(again.freq_dim, cfg.freq_dim);
    EXPECT_EQ(again.eps, cfg.eps);
    EXPECT_EQ(again.rope_theta, 10000.0);
    EXPECT_EQ(again.text_len, c.layout == WeightLayout::wan ? cfg.text_len : 512);  // diffusers: the pipeline's
  }
  // The index lists every tensor with the total byte count.
  nlohmann::json index;
  std::ifstream(dir / "diffusers_sharded/diffusion_pytorch_model.safetensors.index.json") >> index;
  EXPECT_EQ(index["weight_map"].size(), official.size());
  uint64_t total = 0;
  for (const auto& [k, v] : official) total += v.numel() * v.element_size();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
}

TEST(WeightLayoutRoundTrip, InitFromReadsEitherLayoutAndComfyPrefixedFiles) {
  test::ScratchDir dir("weight_layout_init");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  model->init_weights();
  perturb(model, 4);
  const TensorMap official = state_dict(*model);
  write_diffusers_transformer(official, cfg, dir / "pipe/transformer", 100'000);
  std::ofstream(dir / "pipe/model_index.json") << R"({"_class_name": "WanPipeline"})";
  TensorMap prefixed;
  for (const auto& [k, v] : official) prefixed["model.diffusion_model." + k] = v;
  save_safetensors(dir / "comfy.safetensors", prefixed);
  for (const std::string& path : {dir / "pipe", dir / "pipe/transformer",
                                  dir / "pipe/transformer/diffusion_pytorch_model.safetensors.index.json",
                                  dir / "comfy.safetensors"}) {
    SCOPED_TRACE(path);
    DiT loaded(cfg);
    load_state_dict(*loaded, read_weights(path), path);  // what train.init_from does
    for (const auto& [k, v] : state_dict(*loaded)) EXPECT_TRUE(at::equal(v, official.at(k))) << k;
  }
}

// ---- bad input -----------------------------------------------------------------------------------
TEST(WeightLayoutErrors, ShapeMismatchNamesTheTensorWithExpectedAndFoundShapes) {
  test::ScratchDir dir("weight_layout_shape");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  TensorMap official = state_dict(*model);
  official["blocks.1.ffn.0.weight"] = at::zeros({100, 96});
  std::string msg = message_of([&] { write_diffusers_transformer(official, cfg, dir / "out"); });
  EXPECT_NE(msg.find("blocks.1.ffn.0.weight (file [100, 96], model [128, 96])"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));

  // Weights of one config read into a model of another: the loader names the tensor and both shapes.
  write_diffusers_transformer(state_dict(*model), cfg, dir / "good");
  ModelConfig wider = cfg;
  wider.ffn_dim = 64;
  DiT other(wider);
  msg = message_of([&] { load_state_dict(*other, read_transformer_weights(dir / "good"), dir / "good"); });
  EXPECT_NE(msg.find("blocks.0.ffn.0.weight (file [128, 96], model [64, 96])"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir / "good"), std::string::npos) << msg;
}

TEST(WeightLayoutErrors, ExistingNonEmptyOutDirIsRefusedAndLeftAlone) {
  test::ScratchDir dir("weight_layout_outdir");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  fs::create_directories(dir / "taken");
  std::ofstream(dir / "taken/keep.txt") << "mine";
  for (int layout = 0; layout < 2; ++layout) {
    const std::string msg = message_of([&] {
      layout ? write_wan_transformer(state_dict(*model), cfg, dir / "taken")
             : write_diffusers_transformer(state_dict(*model), cfg, dir / "taken");
    });
    EXPECT_NE(msg.find(dir / "taken"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not empty"), std::string::npos) << msg;
  }
  EXPECT_EQ(count_files(dir / "taken", ""), 1u);
  // An empty folder is fine.
  fs::create_directories(dir / "empty");
  write_diffusers_transformer(state_dict(*model), cfg, dir / "empty");
  EXPECT_TRUE(fs::exists(dir / "empty/config.json"));
}

TEST(WeightLayoutErrors, AFailedWriteLeavesNothing) {
  test::ScratchDir dir("weight_layout_fail");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  TensorMap official = state_dict(*model);
  // Right shape, a dtype safetensors cannot store: fails in the middle of writing the shards.
  official["blocks.1.norm3.bias"] = at::zeros({96}, at::kComplexFloat);
  const std::string msg = message_of([&] { write_diffusers_transformer(official, cfg, dir / "out", 100'000); });
  EXPECT_NE(msg.find("blocks.1.norm2.bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_EQ(count_files(dir.path(), ""), 0u) << "a temporary folder was left behind";
  // A RoPE base the layouts cannot record is refused before anything is written.
  ModelConfig demo = cfg;
  demo.rope_theta = 100.0;
  EXPECT_NE(message_of([&] { write_wan_transformer(state_dict(*model), demo, dir / "out"); }).find("rope_theta"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(WeightLayoutErrors, MissingShardOrKeyIsNamed) {
  test::ScratchDir dir("weight_layout_shard");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  write_diffusers_transformer(state_dict(*model), cfg, dir / "t", 100'000);
  const std::string index_path = dir / "t/diffusion_pytorch_model.safetensors.index.json";
  nlohmann::json index;
  std::ifstream(index_path) >> index;

  // A key the index lists that its shard lacks.
  nlohmann::json bad = index;
  bad["weight_map"]["blocks.0.attn1.to_q.extra"] = bad["weight_map"]["blocks.0.attn1.to_q.weight"];
  std::ofstream(index_path) << bad.dump();
  std::string msg = message_of([&] { read_transformer_weights(dir / "t"); });
  EXPECT_NE(msg.find("'blocks.0.attn1.to_q.extra'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(bad["weight_map"]["blocks.0.attn1.to_q.weight"].get<std::string>()), std::string::npos) << msg;

  // A missing shard.
  std::ofstream(index_path) << index.dump();
  const std::string shard = index["weight_map"]["proj_out.weight"].get<std::string>();
  fs::remove(dir / ("t/" + shard));
  msg = message_of([&] { read_transformer_weights(dir / "t"); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(WeightLayoutErrors, ConfigsWithFeaturesOurDiTLacksAreRefused) {
  test::ScratchDir dir("weight_layout_cfg");
  const ModelConfig cfg = small_wan_config();
  DiT model(cfg);
  write_diffusers_transformer(state_dict(*model), cfg, dir / "d");
  nlohmann::json good;
  std::ifstream(dir / "d/config.json") >> good;
  auto refused = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[key] = value;
    std::ofstream(dir / "c.json") << j.dump();
    return message_of([&] { model_config_from_diffusers(dir / "c.json"); });
  };
  // Image conditioning reads as image-to-video, but only whole: image_dim with keys and values of
  // the model's width, a position embedding only with image_dim.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"image_dim", 1280}, {"added_kv_proj_dim", 5120}, {"pos_embed_seq_len", 514}, {"cross_attn_norm", false},
           {"qk_norm", "rms_norm"}, {"new_feature", 3}, {"_class_name", "FluxTransformer2DModel"}}) {
    const std::string msg = refused(key, value);
    EXPECT_NE(msg.find(key == "_class_name" ? "FluxTransformer2DModel" : key), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir / "c.json"), std::string::npos) << msg;
  }
  // diffusers' defaults fill what is left out; out_channels null means in_channels.
  nlohmann::json sparse = {{"_class_name", "WanTransformer3DModel"}, {"num_layers", 30}, {"num_attention_heads", 12},
                           {"ffn_dim", 8960}, {"out_channels", nullptr}};
  std::ofstream(dir / "s.json") << sparse.dump();
  const ModelConfig m = model_config_from_diffusers(dir / "s.json");
  EXPECT_EQ(m.dim, 1536);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.out_channels, 16);
  EXPECT_EQ(m.text_dim, 4096);
  EXPECT_EQ(m.text_len, 512);
  // The official Wan 2.1 1.3B config as released.
  std::ofstream(dir / "w.json") << R"({"_class_name": "WanModel", "_diffusers_version": "0.30.0", "dim": 1536,
    "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_dim": 16, "model_type": "t2v", "num_heads": 12,
    "num_layers": 30, "out_dim": 16, "text_len": 512})";
  const ModelConfig w = model_config_from_wan(dir / "w.json");
  EXPECT_EQ(w.dim, 1536);
  EXPECT_EQ(w.ffn_dim, 8960);
  EXPECT_EQ(w.layers, 30);
  EXPECT_EQ(w.patch, (Patch{1, 2, 2}));
  // Wan 2.1 I2V and FLF2V as released: CLIP features of 1280; FLF2V's position embedding over two images.
  std::ofstream(dir / "w.json") << R"({"_class_name": "WanModel", "model_type": "i2v", "dim": 5120, "in_dim": 36,
    "num_heads": 40, "num_layers": 40, "ffn_dim": 13824})";
  const ModelConfig i2v = model_config_from_wan(dir / "w.json");
  EXPECT_EQ(i2v.image_dim, 1280);
  EXPECT_EQ(i2v.image_pos_tokens, 0);
  EXPECT_EQ(i2v.in_channels, 36);
  std::ofstream(dir / "w.json") << R"({"_class_name": "WanModel", "model_type": "flf2v", "dim": 5120, "in_dim": 36})";
  EXPECT_EQ(model_config_from_wan(dir / "w.json").image_pos_tokens, 514);
  std::ofstream(dir / "w.json") << R"({"_class_name": "WanModel", "model_type": "vace", "dim": 5120})";
  EXPECT_NE(message_of([&] { model_config_from_wan(dir / "w.json"); }).find("vace"), std::string::npos);
  // diffusers' I2V config: image_dim with added_kv_proj_dim = the model's width.
  nlohmann::json i2v_d = good;
  i2v_d["image_dim"] = 48, i2v_d["added_kv_proj_dim"] = cfg.dim;
  std::ofstream(dir / "c.json") << i2v_d.dump();
  EXPECT_EQ(model_config_from_diffusers(dir / "c.json").image_dim, 48);
}

// ---- against diffusers ---------------------------------------------------------------------------
// The reference's folders and forward pass, made once for the suite.
class WeightLayoutDiffusers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!reference_missing().empty()) return;
    dir_ = new test::ScratchDir("weight_layout_diffusers");
    made_ = run(python() + " " + reference_script() + " make " + dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!reference_missing().empty()) GTEST_SKIP() << reference_missing();
    ASSERT_EQ(made_.status, 0) << made_.output;
  }
  static test::ScratchDir* dir_;
  static Ran made_;
};
test::ScratchDir* WeightLayoutDiffusers::dir_ = nullptr;
Ran WeightLayoutDiffusers::made_;

TEST_F(WeightLayoutDiffusers, OurForwardEqualsDiffusersOnItsSavedFolders) {
  const TensorMap io = load_safetensors(*dir_ / "io.safetensors");
  // A pipeline root beside them: model_index.json and transformer/.
  fs::create_directories(*dir_ / "pipeline");
  fs::copy(*dir_ / "unsharded", *dir_ / "pipeline/transformer", fs::copy_options::recursive);
  std::ofstream(*dir_ / "pipeline/model_index.json") << R"({"_class_name": "WanPipeline"})";
  TensorMap first;
  for (const std::string name : {"unsharded", "sharded", "pipeline"}) {
    SCOPED_TRACE(name);
    const std::string path = *dir_ / name;
    EXPECT_EQ(find_transformer_weights(path).layout, WeightLayout::diffusers);
    const ModelConfig cfg = read_transformer_config(path);
    EXPECT_EQ(cfg.dim, 96);
    EXPECT_EQ(cfg.heads, 3);
    EXPECT_EQ(cfg.out_channels, 8);
    EXPECT_EQ(cfg.freq_dim, 64);
    EXPECT_EQ(cfg.eps, 1e-5);
    DiT model(cfg);
    const TensorMap weights = read_transformer_weights(path);
    load_state_dict(*model, weights, path);
    if (first.empty()) first = weights;
    for (const auto& [k, v] : weights) EXPECT_TRUE(at::equal(v, first.at(k))) << k;
    model->eval();
    torch::NoGradGuard ng;
    // text [2, 7, 32]: our model zero-pads it to text_len = 512, as WanPipeline did for diffusers.
    const at::Tensor ours = model->forward(io.at("x"), io.at("t"), io.at("text"));
    ASSERT_EQ(ours.sizes(), io.at("out").sizes());
    const double dev = relative_deviation(ours, io.at("out"));
    // diffusers computes the timestep sinusoid in fp32, we (and official Wan) in fp64: with that
    // one step of diffusers done in fp64 the outputs agree to rounding.
    const double dev64 = relative_deviation(ours, io.at("out_f64_sinusoid"));
    std::printf("[ diffusers ] %s: max |ours - diffusers| / max |diffusers| = %.3g (%.3g with diffusers' "
                "sinusoid in fp64)\n", name.c_str(), dev, dev64);
    EXPECT_LE(dev, 1e-5);
    EXPECT_LE(dev64, 2e-6);
  }
}

TEST_F(WeightLayoutDiffusers, ExportedFolderLoadsInDiffusersWithTheSameForward) {
  const ModelConfig cfg = small_wan_config();
  at::manual_seed(11);
  DiT model(cfg);
  model->init_weights();
  perturb(model, 12);
  const std::string out = *dir_ / "exported";
  write_diffusers_transformer(state_dict(*model), cfg, out, 150'000);
  ASSERT_TRUE(fs::exists(out + "/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_GT(count_files(out, ".safetensors"), 2u);

  at::manual_seed(13);
  const at::Tensor x = at::randn({2, 4, 3, 6, 8}), t = at::tensor({871.25f, 18.0f});
  at::Tensor text = at::randn({2, 5, 32});
  text[1].narrow(0, 3, 2).zero_();
  // diffusers gets the text as our model sees it: zero-padded to text_len.
  const at::Tensor padded = at::constant_pad_nd(text, {0, 0, 0, cfg.text_len - text.size(1)});
  save_safetensors(*dir_ / "export_in.safetensors", {{"x", x}, {"t", t}, {"text", padded}});
  const Ran r = run(python() + " " + reference_script() + " forward " + out + " " + (*dir_ / "export_in.safetensors") +
                    " " + (*dir_ / "export_out.safetensors"));
  ASSERT_EQ(r.status, 0) << r.output;
  const at::Tensor theirs = load_safetensors(*dir_ / "export_out.safetensors").at("out");
  model->eval();
  torch::NoGradGuard ng;
  const at::Tensor ours = model->forward(x, t, text);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const double dev = relative_deviation(ours, theirs);
  std::printf("[ diffusers ] exported: max |ours - diffusers| / max |diffusers| = %.3g\n", dev);
  EXPECT_LE(dev, 1e-5);
}

// ---- image-to-video against diffusers --------------------------------------------------------------
// diffusers' image-to-video WanTransformer3DModel (I2V, and FLF2V with its position embedding):
// read from its saved folder, our forward with its image features equals its; our export (both
// layouts) reads back, and diffusers loads our diffusers folder strictly with the same forward.
class ImageToVideoDiffusers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!reference_missing().empty()) GTEST_SKIP() << reference_missing();
  }
};

TEST_P(ImageToVideoDiffusers, ForwardWithImageFeaturesEqualsDiffusersBothWays) {
  const std::string kind = GetParam();
  test::ScratchDir dir("i2v_" + kind);
  const Ran made = run(python() + " " + reference_script() + " make " + dir.path() + " " + kind);
  ASSERT_EQ(made.status, 0) << made.output;
  const TensorMap io = load_safetensors(dir / "io.safetensors");
  const std::string path = dir / "unsharded";
  const ModelConfig cfg = read_transformer_config(path);
  EXPECT_EQ(cfg.image_dim, 48);
  EXPECT_EQ(cfg.in_channels, 9);
  EXPECT_EQ(cfg.image_pos_tokens, kind == "flf2v" ? 10 : 0);
  DiT model(cfg);
  const TensorMap weights = read_transformer_weights(path);
  load_state_dict(*model, weights, path);  // every tensor has its place, and every parameter a tensor
  model->eval();
  torch::NoGradGuard ng;
  const at::Tensor ours = model->forward(io.at("x"), io.at("t"), io.at("text"), io.at("image"));
  const double dev64 = relative_deviation(ours, io.at("out_f64_sinusoid"));
  std::printf("[ diffusers ] %s: max |ours - diffusers| / max |diffusers| = %.3g (sinusoid in fp64)\n", kind.c_str(),
              dev64);
  EXPECT_LE(relative_deviation(ours, io.at("out")), 1e-5);
  EXPECT_LE(dev64, 2e-6);
  // Without the image, or with the wrong number of tokens for FLF2V's position embedding: named.
  EXPECT_NE(message_of([&] { model->forward(io.at("x"), io.at("t"), io.at("text")); }).find("CLIP features"),
            std::string::npos);
  if (kind == "flf2v")
    EXPECT_NE(message_of([&] { model->forward(io.at("x"), io.at("t"), io.at("text"), io.at("image").narrow(1, 0, 5)); })
                  .find("image_pos_tokens"),
              std::string::npos);

  // The official layout's config cannot state this small model's image width (WanModel fixes
  // 1280): refused, naming it. The diffusers layout reads back, and diffusers loads it strictly.
  EXPECT_NE(message_of([&] { write_wan_transformer(weights, cfg, dir / "wan"); }).find("model.image_dim = 48"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "wan"));
  write_diffusers_transformer(weights, cfg, dir / "exported");
  EXPECT_EQ(read_transformer_config(dir / "exported").image_dim, 48);
  const at::Tensor padded = at::constant_pad_nd(io.at("text"), {0, 0, 0, cfg.text_len - io.at("text").size(1)});
  save_safetensors(dir / "in.safetensors", {{"x", io.at("x")}, {"t", io.at("t")}, {"text", padded}, {"image", io.at("image")}});
  const Ran r = run(python() + " " + reference_script() + " forward " + (dir / "exported") + " " + (dir / "in.safetensors") +
                    " " + (dir / "out.safetensors"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_LE(relative_deviation(ours, load_safetensors(dir / "out.safetensors").at("out")), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ImageToVideoDiffusers, ::testing::Values("i2v", "flf2v"));

}  // namespace
}  // namespace vidit
