// The CLIP image encoder (see clip_vision.h): weights in, hidden states out.
#include "vision/clip_vision.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/hf_checkpoint.h"

namespace fs = std::filesystem;

namespace vidit::vision {
namespace {

// transformers 4 (and so the files on the Hugging Face hub) put the vision tower under this
// prefix; transformers 5 saves a CLIPVisionModel without it.
constexpr const char* kPrefix = "vision_model.";


// A key without the vision tower's prefix.
std::string bare_key(const std::string& key) {
  const std::string prefix = kPrefix;
  return key.rfind(prefix, 0) == 0 ? key.substr(prefix.size()) : key;
}

std::string layer_key(int64_t n, const std::string& rest) { return "encoder.layers." + std::to_string(n) + "." + rest; }

// Every tensor the encoder needs, by its name without the prefix, with its shape, in the order
// the constructor takes them.
struct WeightSpec {
  std::string key;
  std::vector<int64_t> shape;
};
std::vector<WeightSpec> weight_specs(const ClipVisionConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  std::vector<WeightSpec> s = {
      {"embeddings.class_embedding", {d}},
      {"embeddings.patch_embedding.weight", {d, c.num_channels, c.patch_size, c.patch_size}},
      {"embeddings.position_embedding.weight", {c.tokens(), d}},
      {"pre_layrnorm.weight", {d}},
      {"pre_layrnorm.bias", {d}},
      {"post_layernorm.weight", {d}},
      {"post_layernorm.bias", {d}},
  };
  for (int64_t n = 0; n < c.num_hidden_layers; ++n) {
    for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      s.push_back({layer_key(n, std::string("self_attn.") + p + ".weight"), {d, d}});
      s.push_back({layer_key(n, std::string("self_attn.") + p + ".bias"), {d}});
    }
    for (const char* p : {"layer_norm1", "layer_norm2"}) {
      s.push_back({layer_key(n, std::string(p) + ".weight"), {d}});
      s.push_back({layer_key(n, std::string(p) + ".bias"), {d}});
    }
    s.push_back({layer_key(n, "mlp.fc1.weight"), {f, d}});
    s.push_back({layer_key(n, "mlp.fc1.bias"), {f}});
    s.push_back({layer_key(n, "mlp.fc2.weight"), {d, f}});
    s.push_back({layer_key(n, "mlp.fc2.bias"), {d}});
  }
  return s;
}

// Tensors kept in fp32 whatever the compute dtype: what is added to or normalises the fp32
// residual stream (the embeddings and the norms).
bool stays_fp32(const std::string& key) {
  return key.find("norm") != std::string::npos || key == "embeddings.class_embedding" ||
         key == "embeddings.position_embedding.weight";
}

using WeightFiles = HfWeightFiles;

WeightFiles find_weight_files(const std::string& path) {
  return find_hf_weight_files(path, "image_encoder", "CLIP vision weights", /*allow_pth=*/false);
}

}  // namespace

ClipVisionConfig ClipVisionConfig::vit_h_14() {
  ClipVisionConfig c;
  c.hidden_size = 1280, c.intermediate_size = 5120, c.num_hidden_layers = 32, c.num_attention_heads = 16;
  c.patch_size = 14, c.hidden_act = "gelu";
  return c;
}

int64_t ClipVisionConfig::parameters() const {
  int64_t n = 0;
  for (const auto& s : weight_specs(*this)) {
    int64_t k = 1;
    for (int64_t d : s.shape) k *= d;
    n += k;
  }
  return n;
}

ClipVisionConfig ClipVisionConfig::from_json_file(const std::string& path) {
  nlohmann::json root;
  try {
    std::ifstream in(path);
    VIDIT_CHECK(in.good(), "cannot open");
    root = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("CLIP vision config '", path, "': cannot read it as JSON (", e.what(), ")");
  }
  VIDIT_CHECK(root.is_object(), "CLIP vision config '", path, "': not a JSON object");
  // A CLIPConfig holds the vision tower's fields in vision_config; a CLIPVisionConfig at the top.
  const nlohmann::json* j = &root;
  std::string where;  // the fields' place in the file, for messages
  if (root.contains("vision_config")) {
    VIDIT_CHECK(root["vision_config"].is_object(), "CLIP vision config '", path, "': vision_config is not an object");
    j = &root["vision_config"];
    where = "vision_config.";
  }
  for (const nlohmann::json* level : std::initializer_list<const nlohmann::json*>{&root, j}) {
    if (!level->contains("model_type")) continue;
    const auto& t = (*level)["model_type"];
    const std::string type = t.is_string() ? t.get<std::string>() : "?";
    VIDIT_CHECK(type == "clip_vision_model" || type == "clip", "CLIP vision config '", path, "': model_type is \"",
                type, "\", not \"clip_vision_model\" (nor a \"clip\" model with a vision_config); vidit reads "
                "CLIP's vision tower (class token, pre_layrnorm), as Wan 2.1's image encoder is");
  }
  ClipVisionConfig c;
  auto integer = [&](const char* key, int64_t& field) {
    if (!j->contains(key)) return;  // transformers' default
    const auto& v = (*j)[key];
    VIDIT_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, "CLIP vision config '", path, "': \"", where, key,
                "\" is not a positive integer");
    field = v.get<int64_t>();
  };
  integer("hidden_size", c.hidden_size);
  integer("intermediate_size", c.intermediate_size);
  integer("num_hidden_layers", c.num_hidden_layers);
  integer("num_attention_heads", c.num_attention_heads);
  integer("num_channels", c.num_channels);
  integer("image_size", c.image_size);
  integer("patch_size", c.patch_size);
  if (j->contains("layer_norm_eps")) {
    const auto& v = (*j)["layer_norm_eps"];
    VIDIT_CHECK(v.is_number() && v.get<double>() > 0, "CLIP vision config '", path, "': \"", where,
                "layer_norm_eps\" is not a positive number");
    c.layer_norm_eps = v.get<double>();
  }
  if (j->contains("hidden_act")) {
    VIDIT_CHECK((*j)["hidden_act"].is_string(), "CLIP vision config '", path, "': \"", where, "hidden_act\" is not a string");
    c.hidden_act = (*j)["hidden_act"].get<std::string>();
  }
  VIDIT_CHECK(c.hidden_act == "gelu" || c.hidden_act == "quick_gelu" || c.hidden_act == "gelu_new" ||
                  c.hidden_act == "gelu_pytorch_tanh",
              "CLIP vision config '", path, "': hidden_act \"", c.hidden_act, "\" is not supported (use gelu, "
              "quick_gelu, gelu_new or gelu_pytorch_tanh)");
  VIDIT_CHECK(c.hidden_size % c.num_attention_heads == 0, "CLIP vision config '", path, "': hidden_size ",
              c.hidden_size, " is not a multiple of num_attention_heads ", c.num_attention_heads);
  VIDIT_CHECK(c.image_size >= c.patch_size, "CLIP vision config '", path, "': image_size ", c.image_size,
              " is smaller than patch_size ", c.patch_size);
  return c;
}

ClipVisionEncoder::ClipVisionEncoder(const ClipVisionConfig& cfg, const TensorMap& hf_weights, at::ScalarType dtype,
                                     at::Device device, const std::string& source)
    : cfg_(cfg), dtype_(dtype), device_(device) {
  VIDIT_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "CLIP vision: compute dtype must be fp32 or bf16");
  VIDIT_CHECK(!device.is_cuda() || at::hasCUDA(), "CLIP vision: device ", device.str(),
              " asked for, but this LibTorch was built without CUDA; use the CPU or a CUDA build");
  at::NoGradGuard no_grad;
  std::map<std::string, const at::Tensor*> by_name;  // names without the prefix
  for (const auto& [k, t] : hf_weights) by_name.emplace(bare_key(k), &t);
  auto take = [&](const WeightSpec& s) -> at::Tensor {
    auto it = by_name.find(s.key);
    VIDIT_CHECK(it != by_name.end(), "CLIP vision weights '", source, "': tensor '", kPrefix, s.key,
                "' is missing (with or without the '", kPrefix, "' prefix); the checkpoint does not match its config (",
                cfg_.num_hidden_layers, " layers, hidden_size ", cfg_.hidden_size, ") or is not a CLIP vision model");
    const at::Tensor& t = *it->second;
    VIDIT_CHECK(t.sizes().vec() == s.shape, "CLIP vision weights '", source, "': tensor '", kPrefix, s.key,
                "' has shape ", shape_str(t.sizes()), ", expected ", shape_str(s.shape), " from the config");
    // Always a copy: the source may be a view into a mapped file.
    return t.to(device, stays_fp32(s.key) ? at::kFloat : dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
  };
  const auto specs = weight_specs(cfg_);
  size_t i = 0;
  class_ = take(specs[i++]);
  patch_w_ = take(specs[i++]);
  position_ = take(specs[i++]);
  pre_norm_.weight = take(specs[i++]);
  pre_norm_.bias = take(specs[i++]);
  post_norm_.weight = take(specs[i++]);
  post_norm_.bias = take(specs[i++]);
  for (int64_t n = 0; n < cfg_.num_hidden_layers; ++n) {
    Layer l;
    at::Tensor proj[4][2];  // q, k, v, out: weight, bias
    for (auto& p : proj) {
      p[0] = take(specs[i++]);
      p[1] = take(specs[i++]);
    }
    l.qkv_w = at::cat({proj[0][0], proj[1][0], proj[2][0]}, 0);
    l.qkv_b = at::cat({proj[0][1], proj[1][1], proj[2][1]}, 0);
    l.out_w = proj[3][0];
    l.out_b = proj[3][1];
    l.norm1.weight = take(specs[i++]);
    l.norm1.bias = take(specs[i++]);
    l.norm2.weight = take(specs[i++]);
    l.norm2.bias = take(specs[i++]);
    l.fc1_w = take(specs[i++]);
    l.fc1_b = take(specs[i++]);
    l.fc2_w = take(specs[i++]);
    l.fc2_b = take(specs[i++]);
    layers_.push_back(std::move(l));
  }
}

ClipVisionEncoder ClipVisionEncoder::load(const std::string& path, at::ScalarType dtype, at::Device device) {
  const WeightFiles files = find_weight_files(path);
  const std::string& first = files.files.front();
  VIDIT_CHECK(!files.config.empty(), "CLIP vision weights '", first, "': no config.json beside it; the tensors' "
              "shapes do not tell the number of heads nor the activation, so pass the image_encoder folder (or put "
              "its config.json beside the file)");
  const ClipVisionConfig cfg = ClipVisionConfig::from_json_file(files.config);
  const std::string where = files.index.empty() ? first : files.index;
  // Map every file and keep views of the tensors the encoder uses; the constructor copies them.
  std::set<std::string> wanted;
  for (const auto& s : weight_specs(cfg)) wanted.insert(s.key);
  TensorMap views;
  std::map<std::string, std::string> origin;  // name -> its file, for messages
  for (const auto& f : files.files) {
    for (auto& [k, t] : map_safetensors(f)) {
      const std::string name = bare_key(k);
      if (!wanted.count(name)) continue;
      views.emplace(name, t);
      origin.emplace(name, f);
    }
  }
  for (const auto& s : weight_specs(cfg)) {
    auto it = views.find(s.key);
    if (it == views.end()) {
      if (files.files.size() > 1)
        fail("CLIP vision weights: tensor '", kPrefix, s.key, "' is in none of the ", files.files.size(),
             " shards of '", where, "'; the checkpoint is incomplete or not a ", cfg.num_hidden_layers,
             "-layer CLIP vision model");
      fail("CLIP vision weights: tensor '", kPrefix, s.key, "' is missing from '", where, "' (with or without the '",
           kPrefix, "' prefix); the checkpoint does not match its config (", cfg.num_hidden_layers,
           " layers) or is not a CLIP vision model");
    }
    VIDIT_CHECK(it->second.sizes().vec() == s.shape, "CLIP vision weights: tensor '", kPrefix, s.key, "' in '",
                origin.at(s.key), "' has shape ", shape_str(it->second.sizes()), ", expected ", shape_str(s.shape),
                " from '", files.config, "'");
  }
  return ClipVisionEncoder(cfg, views, dtype, device, where);
}

at::Tensor ClipVisionEncoder::norm(const Norm& n, const at::Tensor& x) const {
  return at::layer_norm(x, {cfg_.hidden_size}, n.weight, n.bias, cfg_.layer_norm_eps);
}

at::Tensor ClipVisionEncoder::activation(const at::Tensor& x) const {
  if (cfg_.hidden_act == "gelu") return at::gelu(x);
  if (cfg_.hidden_act == "quick_gelu") return x * at::sigmoid(x * 1.702);
  return at::gelu(x, "tanh");  // gelu_new, gelu_pytorch_tanh
}

at::Tensor ClipVisionEncoder::embed(const at::Tensor& pixel_values) const {
  const auto& c = cfg_;
  VIDIT_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == c.num_channels &&
                  pixel_values.size(2) == c.image_size && pixel_values.size(3) == c.image_size,
              "CLIP vision: pixel_values must be [B, ", c.num_channels, ", ", c.image_size, ", ", c.image_size,
              "] (the config's num_channels and image_size), got ", shape_str(pixel_values.sizes()),
              "; preprocess images with clip_pixel_values (vision/image_input.h)");
  VIDIT_CHECK(pixel_values.is_floating_point(), "CLIP vision: pixel_values must be floating point "
              "(normalised pixels), got ", pixel_values.scalar_type());
  const int64_t B = pixel_values.size(0);
  // One token per patch, row by row: [B, hidden, grid, grid] -> [B, grid², hidden].
  const at::Tensor patches = at::conv2d(pixel_values.to(device_, dtype_), patch_w_, /*bias=*/{},
                                        /*stride=*/{c.patch_size, c.patch_size});
  const at::Tensor tokens = patches.flatten(2).transpose(1, 2).to(at::kFloat);
  const at::Tensor cls = class_.view({1, 1, c.hidden_size}).expand({B, 1, c.hidden_size});
  return norm(pre_norm_, at::cat({cls, tokens}, 1) + position_.unsqueeze(0));
}

at::Tensor ClipVisionEncoder::run_layer(const Layer& l, const at::Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), d = cfg_.hidden_size, H = cfg_.num_attention_heads;
  const at::Tensor qkv = at::linear(norm(l.norm1, x).to(dtype_), l.qkv_w, l.qkv_b);
  const at::Tensor heads = qkv.view({B, T, 3, H, cfg_.head_dim()}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, hd]
  // Default scale 1 / sqrt(head_dim), as CLIP's; no mask: every token sees every token.
  const at::Tensor a = at::scaled_dot_product_attention(heads[0], heads[1], heads[2]);
  at::Tensor y = x + at::linear(a.transpose(1, 2).reshape({B, T, d}), l.out_w, l.out_b).to(at::kFloat);
  const at::Tensor h = activation(at::linear(norm(l.norm2, y).to(dtype_), l.fc1_w, l.fc1_b));
  return y + at::linear(h, l.fc2_w, l.fc2_b).to(at::kFloat);
}

ClipVisionOutput ClipVisionEncoder::forward(const at::Tensor& pixel_values) const {
  c10::InferenceMode inference;
  ClipVisionOutput out;
  out.hidden_states.reserve(layers_.size() + 1);
  out.hidden_states.push_back(embed(pixel_values));
  for (const Layer& l : layers_) out.hidden_states.push_back(run_layer(l, out.hidden_states.back()));
  out.pooled = norm(post_norm_, out.hidden_states.back().select(1, 0));
  return out;
}

std::vector<at::Tensor> ClipVisionEncoder::hidden_states(const at::Tensor& pixel_values) const {
  return forward(pixel_values).hidden_states;
}

at::Tensor ClipVisionEncoder::hidden_state(const at::Tensor& pixel_values, int64_t index) const {
  const int64_t count = static_cast<int64_t>(layers_.size()) + 1;
  VIDIT_CHECK(index >= -count && index < count, "CLIP vision: hidden state ", index, " asked for, but a ",
              count - 1, "-layer encoder has ", count, " (indices ", -count, " to ", count - 1, ")");
  if (index < 0) index += count;
  c10::InferenceMode inference;
  at::Tensor x = embed(pixel_values);
  for (int64_t n = 0; n < index; ++n) x = run_layer(layers_[n], x);
  return x;
}

}  // namespace vidit::vision
