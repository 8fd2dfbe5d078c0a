// The umT5 encoder (see umt5.h): weights in, hidden states out.
#include "text/umt5.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/hf_checkpoint.h"
#include "core/mapped_file.h"

namespace fs = std::filesystem;

namespace vidit::text {
namespace {


std::string block_key(int64_t n, const std::string& rest) {
  return "encoder.block." + std::to_string(n) + ".layer." + rest;
}

// Every tensor the encoder needs, under its Hugging Face name, with its shape. The embedding is
// listed as shared.weight (encoder.embed_tokens.weight is accepted for it).
struct WeightSpec {
  std::string key;
  std::vector<int64_t> shape;
};
std::vector<WeightSpec> weight_specs(const Umt5Config& c) {
  const int64_t d = c.d_model, inner = c.inner_dim();
  std::vector<WeightSpec> s = {{"shared.weight", {c.vocab_size, d}}, {"encoder.final_layer_norm.weight", {d}}};
  for (int64_t n = 0; n < c.num_layers; ++n) {
    for (const char* p : {"q", "k", "v"}) s.push_back({block_key(n, std::string("0.SelfAttention.") + p + ".weight"), {inner, d}});
    s.push_back({block_key(n, "0.SelfAttention.o.weight"), {d, inner}});
    s.push_back({block_key(n, "0.SelfAttention.relative_attention_bias.weight"), {c.num_buckets, c.num_heads}});
    s.push_back({block_key(n, "0.layer_norm.weight"), {d}});
    if (c.gated()) {
      s.push_back({block_key(n, "1.DenseReluDense.wi_0.weight"), {c.d_ff, d}});
      s.push_back({block_key(n, "1.DenseReluDense.wi_1.weight"), {c.d_ff, d}});
    } else {
      s.push_back({block_key(n, "1.DenseReluDense.wi.weight"), {c.d_ff, d}});
    }
    s.push_back({block_key(n, "1.DenseReluDense.wo.weight"), {d, c.d_ff}});
    s.push_back({block_key(n, "1.layer_norm.weight"), {d}});
  }
  return s;
}

bool is_norm(const std::string& key) { return key.find("layer_norm") != std::string::npos; }

// Where the embedding is found: shared.weight or its tied twin.
const at::Tensor* find_embedding(const TensorMap& w) {
  for (const char* k : {"shared.weight", "encoder.embed_tokens.weight"}) {
    auto it = w.find(k);
    if (it != w.end()) return &it->second;
  }
  return nullptr;
}

// The shape of an encoder whose config is not given, read from its tensors (HF names).
Umt5Config infer_config(const std::map<std::string, std::vector<int64_t>>& shapes, const std::string& source) {
  auto get = [&](const std::string& k) -> const std::vector<int64_t>* {
    auto it = shapes.find(k);
    return it == shapes.end() ? nullptr : &it->second;
  };
  Umt5Config c;
  const auto* emb = get("shared.weight");
  if (!emb) emb = get("encoder.embed_tokens.weight");
  VIDIT_CHECK(emb && emb->size() == 2, "umT5 weights '", source, "': no token embedding (shared.weight, "
              "encoder.embed_tokens.weight or Wan's token_embedding.weight); is this a umT5 text encoder?");
  c.vocab_size = (*emb)[0];
  c.d_model = (*emb)[1];
  c.num_layers = 0;
  while (get(block_key(c.num_layers, "0.SelfAttention.q.weight"))) ++c.num_layers;
  VIDIT_CHECK(c.num_layers > 0, "umT5 weights '", source, "': no encoder blocks (", block_key(0, "0.SelfAttention.q.weight"),
              " or Wan's blocks.0.attn.q.weight)");
  const auto* bias = get(block_key(0, "0.SelfAttention.relative_attention_bias.weight"));
  VIDIT_CHECK(bias && bias->size() == 2, "umT5 weights '", source, "': no ", block_key(0, "0.SelfAttention.relative_attention_bias.weight"));
  c.num_buckets = (*bias)[0];
  c.num_heads = (*bias)[1];
  c.d_kv = (*get(block_key(0, "0.SelfAttention.q.weight")))[0] / c.num_heads;
  if (const auto* wi0 = get(block_key(0, "1.DenseReluDense.wi_0.weight"))) {
    c.d_ff = (*wi0)[0];
  } else if (const auto* wi = get(block_key(0, "1.DenseReluDense.wi.weight"))) {
    c.d_ff = (*wi)[0];
    c.feed_forward_proj = "gelu";
  } else {
    fail("umT5 weights '", source, "': no feed-forward weights (", block_key(0, "1.DenseReluDense.wi_0.weight"), ")");
  }
  return c;  // max_distance 128 and eps 1e-6: umT5's values (the tensors do not tell)
}

// The conversion every loaded tensor gets: norms in fp32, the rest in the compute dtype, always a
// copy (the source may be a view into a mapped file).
at::Tensor convert(const at::Tensor& t, const std::string& key, at::ScalarType dtype, at::Device device) {
  return t.to(device, is_norm(key) ? at::kFloat : dtype, /*non_blocking=*/false, /*copy=*/true);
}

std::string json_conversion_hint(const std::string& file) {
  return "python3 -c \"import torch, safetensors.torch as st; st.save_file(torch.load('" + file +
         "', map_location='cpu'), '" + fs::path(file).replace_extension(".safetensors").string() + "')\"";
}

// A torch.save'd state dict (Wan's .pth), through LibTorch's unpickler.
TensorMap read_pickled_state_dict(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  VIDIT_CHECK(in.good(), "umT5 weights: cannot open '", file, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TensorMap out;
  try {
    const c10::IValue v = torch::jit::pickle_load(bytes);
    VIDIT_CHECK(v.isGenericDict(), "not a state dict");
    for (const auto& item : v.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor()) continue;
      out[wan_key_to_hf(item.key().toStringRef())] = item.value().toTensor();
    }
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) why = ce->what_without_backtrace();
    fail("umT5 weights: LibTorch cannot read the pickled checkpoint '", file, "' (", why.substr(0, 300),
         "). Convert it to safetensors once and pass that file instead:\n  ", json_conversion_hint(file));
  }
  VIDIT_CHECK(!out.empty(), "umT5 weights: '", file, "' holds no tensors");
  return out;
}

using WeightFiles = HfWeightFiles;

WeightFiles find_weight_files(const std::string& path) {
  return find_hf_weight_files(path, "text_encoder", "umT5 weights", /*allow_pth=*/true);
}

Umt5Config resolve_config(const WeightFiles& w, const std::map<std::string, std::vector<int64_t>>& shapes,
                          const std::string& source) {
  return w.config.empty() ? infer_config(shapes, source) : Umt5Config::from_json_file(w.config);
}

}  // namespace

bool Umt5Config::gated() const { return feed_forward_proj.rfind("gated-", 0) == 0; }

std::string Umt5Config::activation() const {
  // transformers: "gated-gelu" is the one spelling that means gelu_new (the tanh GELU).
  if (feed_forward_proj == "gated-gelu") return "gelu_new";
  return gated() ? feed_forward_proj.substr(6) : feed_forward_proj;
}

Umt5Config Umt5Config::from_json_file(const std::string& path) {
  nlohmann::json j;
  try {
    std::ifstream in(path);
    VIDIT_CHECK(in.good(), "cannot open");
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("umT5 config '", path, "': cannot read it as JSON (", e.what(), ")");
  }
  const std::string type = j.value("model_type", "umt5");
  VIDIT_CHECK(type == "umt5", "umT5 config '", path, "': model_type is \"", type, "\", not \"umt5\"; vidit reads "
              "umT5 encoders (each block with its own position bias), as Wan's text encoder is");
  Umt5Config c;
  auto need = [&](const char* key, int64_t& field) {
    VIDIT_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() > 0, "umT5 config '", path,
                "': \"", key, "\" is missing or not a positive integer");
    field = j[key].get<int64_t>();
  };
  need("d_model", c.d_model);
  need("d_kv", c.d_kv);
  need("d_ff", c.d_ff);
  need("num_heads", c.num_heads);
  need("num_layers", c.num_layers);
  need("vocab_size", c.vocab_size);
  if (j.contains("relative_attention_num_buckets")) need("relative_attention_num_buckets", c.num_buckets);
  if (j.contains("relative_attention_max_distance")) need("relative_attention_max_distance", c.max_distance);
  if (j.contains("layer_norm_epsilon")) {
    VIDIT_CHECK(j["layer_norm_epsilon"].is_number(), "umT5 config '", path, "': layer_norm_epsilon is not a number");
    c.eps = j["layer_norm_epsilon"].get<double>();
  }
  if (j.contains("feed_forward_proj")) c.feed_forward_proj = j["feed_forward_proj"].get<std::string>();
  const std::string act = c.activation();
  VIDIT_CHECK(act == "gelu_new" || act == "gelu" || act == "relu" || act == "gelu_pytorch_tanh" || act == "silu",
              "umT5 config '", path, "': feed_forward_proj \"", c.feed_forward_proj, "\" is not supported (use "
              "[gated-]gelu, gelu_new, gelu_pytorch_tanh, relu or silu)");
  VIDIT_CHECK(c.num_buckets >= 4, "umT5 config '", path, "': relative_attention_num_buckets must be >= 4");
  return c;
}

std::string wan_key_to_hf(const std::string& key) {
  static const std::map<std::string, std::string> top = {{"token_embedding.weight", "shared.weight"},
                                                         {"norm.weight", "encoder.final_layer_norm.weight"}};
  if (auto it = top.find(key); it != top.end()) return it->second;
  static const std::regex block(R"(^blocks\.(\d+)\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(key, m, block)) return key;
  static const std::map<std::string, std::string> inner = {
      {"attn.q.weight", "0.SelfAttention.q.weight"},
      {"attn.k.weight", "0.SelfAttention.k.weight"},
      {"attn.v.weight", "0.SelfAttention.v.weight"},
      {"attn.o.weight", "0.SelfAttention.o.weight"},
      {"pos_embedding.embedding.weight", "0.SelfAttention.relative_attention_bias.weight"},
      {"norm1.weight", "0.layer_norm.weight"},
      {"norm2.weight", "1.layer_norm.weight"},
      {"ffn.gate.0.weight", "1.DenseReluDense.wi_0.weight"},
      {"ffn.fc1.weight", "1.DenseReluDense.wi_1.weight"},
      {"ffn.fc2.weight", "1.DenseReluDense.wo.weight"}};
  auto it = inner.find(m[2].str());
  return it == inner.end() ? key : block_key(std::stoll(m[1].str()), it->second);
}

at::Tensor relative_position_buckets(int64_t L, int64_t num_buckets, int64_t max_distance, at::Device device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor rel = at::arange(L, opts).unsqueeze(0) - at::arange(L, opts).unsqueeze(1);  // key - query
  const int64_t half = num_buckets / 2;  // one half for keys after the query, one for the rest
  at::Tensor buckets = rel.gt(0).to(at::kLong) * half;
  rel = rel.abs();
  const int64_t max_exact = half / 2;
  const at::Tensor is_small = rel.lt(max_exact);
  // transformers' arithmetic, op for op: fp32 log of distance/max_exact, scaled, truncated.
  at::Tensor log_ratio = at::log(rel.to(at::kFloat) / max_exact) /
                         std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact));
  log_ratio = log_ratio * (half - max_exact);
  const at::Tensor large = at::clamp_max(log_ratio.to(at::kLong) + max_exact, half - 1);
  return buckets + at::where(is_small, rel, large);
}

Umt5Encoder::Umt5Encoder(const Umt5Config& cfg, const TensorMap& w, at::ScalarType dtype, at::Device device,
                         const std::string& source)
    : cfg_(cfg), dtype_(dtype), device_(device) {
  VIDIT_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "umT5: compute dtype must be fp32 or bf16");
  at::NoGradGuard no_grad;
  auto take = [&](const WeightSpec& s) -> at::Tensor {
    const at::Tensor* t = nullptr;
    if (s.key == "shared.weight") {
      t = find_embedding(w);
    } else if (auto it = w.find(s.key); it != w.end()) {
      t = &it->second;
    }
    VIDIT_CHECK(t != nullptr, "umT5 weights '", source, "': tensor '", s.key, "' is missing",
                s.key == "shared.weight" ? " (nor encoder.embed_tokens.weight, nor Wan's token_embedding.weight)" : "",
                "; the checkpoint does not match config (", cfg_.num_layers, " layers, d_model ", cfg_.d_model, ")");
    VIDIT_CHECK(t->sizes().vec() == s.shape, "umT5 weights '", source, "': tensor '", s.key, "' has shape ",
                shape_str(t->sizes()), ", expected ", shape_str(s.shape), " from the config");
    return t->to(device, is_norm(s.key) ? at::kFloat : dtype);
  };
  const auto specs = weight_specs(cfg_);
  size_t i = 0;
  embed_ = take(specs[i++]);
  final_norm_ = take(specs[i++]);
  for (int64_t n = 0; n < cfg_.num_layers; ++n) {
    Block b;
    at::Tensor q = take(specs[i++]), k = take(specs[i++]), v = take(specs[i++]);
    b.qkv = PackedLinear(at::cat({q, k, v}, 0));
    b.o = PackedLinear(take(specs[i++]));
    b.rel_bias = take(specs[i++]).t().contiguous();
    b.norm_attn = take(specs[i++]);
    if (cfg_.gated()) {
      at::Tensor w0 = take(specs[i++]), w1 = take(specs[i++]);
      b.wi = PackedLinear(at::cat({w0, w1}, 0));
    } else {
      b.wi = PackedLinear(take(specs[i++]));
    }
    b.wo = PackedLinear(take(specs[i++]));
    b.norm_ff = take(specs[i++]);
    blocks_.push_back(std::move(b));
  }
}

Umt5Encoder Umt5Encoder::load(const std::string& path, at::ScalarType dtype, at::Device device) {
  const WeightFiles files = find_weight_files(path);
  const std::string& first = files.files.front();
  const std::string ext = fs::path(first).extension().string();
  if (ext == ".pth" || ext == ".pt" || ext == ".bin") {
    const TensorMap w = read_pickled_state_dict(first);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [k, t] : w) shapes[k] = t.sizes().vec();
    return Umt5Encoder(resolve_config(files, shapes, first), w, dtype, device, first);
  }
  // safetensors: map every file, read the headers, then copy only the tensors needed.
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::map<std::string, std::pair<at::Tensor, std::string>> views;  // HF name -> (view, file)
  for (const auto& f : files.files) {
    maps.push_back(std::make_unique<MappedFile>(f, "umT5 weights", "check the path and that the download finished"));
    for (auto& [k, t] : view_safetensors(maps.back()->data(), maps.back()->size(), f)) {
      const std::string hf = wan_key_to_hf(k);
      views.emplace(hf, std::make_pair(t, f));
    }
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [k, v] : views) shapes[k] = v.first.sizes().vec();
  const std::string where = files.index.empty() ? first : files.index;
  const Umt5Config cfg = resolve_config(files, shapes, where);
  TensorMap w;
  for (const auto& s : weight_specs(cfg)) {
    auto it = views.find(s.key);
    if (it == views.end() && s.key == "shared.weight") it = views.find("encoder.embed_tokens.weight");
    if (it == views.end()) {
      if (files.files.size() > 1)
        fail("umT5 weights: tensor '", s.key, "' is in none of the ", files.files.size(), " shards of '", where,
             "'; the checkpoint is incomplete or not a ", cfg.num_layers, "-layer umT5 encoder");
      fail("umT5 weights: tensor '", s.key, "' is missing from '", where, "'; the checkpoint does not match its "
           "config (", cfg.num_layers, " layers) or is not a umT5 encoder");
    }
    const at::Tensor& t = it->second.first;
    VIDIT_CHECK(t.sizes().vec() == s.shape, "umT5 weights: tensor '", s.key, "' in '", it->second.second,
                "' has shape ", shape_str(t.sizes()), ", expected ", shape_str(s.shape), " from the config");
    w[s.key] = convert(t, s.key, dtype, device);
  }
  return Umt5Encoder(cfg, w, dtype, device, where);
}

at::Tensor Umt5Encoder::ffn_act(const at::Tensor& x) const {
  const std::string act = cfg_.activation();
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (act == "gelu") return at::gelu(x);
  if (act == "relu") return at::relu(x);
  return at::silu(x);
}

at::Tensor Umt5Encoder::forward(const at::Tensor& ids_in, const at::Tensor& mask_in, PaddedRows padded) const {
  c10::InferenceMode inference;
  VIDIT_CHECK(ids_in.dim() == 2 && mask_in.sizes() == ids_in.sizes(), "umT5: ids and mask must both be [B, L] (got ",
              shape_str(ids_in.sizes()), " and ", shape_str(mask_in.sizes()), ")");
  const int64_t B = ids_in.size(0), L = ids_in.size(1), d = cfg_.d_model, H = cfg_.num_heads, dk = cfg_.d_kv;
  const at::Tensor ids = ids_in.to(device_, at::kLong);
  VIDIT_CHECK(ids.numel() == 0 || (ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < cfg_.vocab_size),
              "umT5: token ids outside [0, ", cfg_.vocab_size, "): the tokenizer does not belong to this encoder");
  if (B * L == 0) return at::zeros({B, L, d}, at::TensorOptions().dtype(at::kFloat).device(device_));
  const at::Tensor buckets = relative_position_buckets(L, cfg_.num_buckets, cfg_.max_distance, device_);
  const bool every_row = padded == PaddedRows::computed;

  // The encoder works on a matrix of rows: each batch row's positions (all of them, or its real
  // tokens only) as one contiguous segment. Attention looks only at real keys: transformers adds
  // the lowest finite number to the scores of padded keys, whose softmax weight is then exactly 0,
  // so leaving those keys out is the same sum without its zero terms (and no [B, H, L, L] mask is
  // built). Batch rows with the same mask share one key set.
  struct KeySet {
    at::Tensor real;     // bool [L] (CPU): the mask row
    at::Tensor keys;     // int64: the segment's rows that are keys; undefined when all are
    at::Tensor buckets;  // int64 [rows * keys], flattened: the position-bias buckets
    int64_t rows = 0;    // rows of a segment with this mask
  };
  struct Segment {
    int64_t start;   // first row
    size_t key_set;  // its mask's KeySet (which gives its number of rows)
  };
  std::vector<KeySet> key_sets;
  std::vector<Segment> segments;
  std::vector<at::Tensor> gather;  // zeros mode: each batch row's real positions in [B * L]
  const at::Tensor real = mask_in.ne(0).cpu();
  int64_t R = 0;
  for (int64_t r = 0; r < B; ++r) {
    const at::Tensor row = real[r];
    const int64_t n = row.sum().item<int64_t>();
    VIDIT_CHECK(n > 0, "umT5: row ", r, " of the mask has no real token (every row needs at least one)");
    const at::Tensor pos = n < L ? row.nonzero().flatten().to(device_) : at::Tensor();
    size_t k = 0;
    while (k < key_sets.size() && !at::equal(key_sets[k].real, row)) ++k;
    if (k == key_sets.size()) {
      KeySet s;
      s.real = row;
      s.rows = every_row ? L : n;
      if (pos.defined()) {
        s.buckets = (every_row ? buckets : buckets.index_select(0, pos)).index_select(1, pos).flatten();
        if (every_row) s.keys = pos;
      } else {
        s.buckets = buckets.flatten();
      }
      key_sets.push_back(std::move(s));
    }
    segments.push_back({R, k});
    R += key_sets[k].rows;
    if (!every_row) gather.push_back(pos.defined() ? pos + r * L : at::arange(r * L, (r + 1) * L, ids.options()));
  }
  const at::Tensor index = !every_row && R < B * L ? at::cat(gather) : at::Tensor();  // rows -> [B * L]
  at::Tensor flat_ids = ids.reshape({B * L});
  if (index.defined()) flat_ids = flat_ids.index_select(0, index);

  at::Tensor x = at::embedding(embed_, flat_ids).to(at::kFloat);  // [R, d], the fp32 residual stream
  at::Tensor attn = at::empty({R, H, dk}, x.options().dtype(dtype_));
  std::vector<at::Tensor> bias(key_sets.size());
  for (const Block& b : blocks_) {
    at::Tensor h = at::rms_norm(x, {d}, b.norm_attn, cfg_.eps).to(dtype_);
    const at::Tensor qkv = b.qkv(h).view({R, 3, H, dk});
    for (size_t k = 0; k < key_sets.size(); ++k)  // this block's bias [1, H, rows, keys], contiguous
      bias[k] = b.rel_bias.index_select(1, key_sets[k].buckets).view({1, H, key_sets[k].rows, -1});
    for (const Segment& s : segments) {
      const KeySet& ks = key_sets[s.key_set];
      // [1, H, rows, dk] views of the segment's q, k, v
      auto part = [&](int64_t i) { return qkv.narrow(0, s.start, ks.rows).select(1, i).transpose(0, 1).unsqueeze(0); };
      at::Tensor k = part(1), v = part(2);
      if (ks.keys.defined()) {
        k = k.index_select(2, ks.keys);
        v = v.index_select(2, ks.keys);
      }
      const at::Tensor a = at::scaled_dot_product_attention(part(0), k, v, bias[s.key_set], 0.0, false, /*scale=*/1.0);
      attn.narrow(0, s.start, ks.rows).copy_(a[0].transpose(0, 1));
    }
    x.add_(b.o(attn.view({R, H * dk})));
    h = at::rms_norm(x, {d}, b.norm_ff, cfg_.eps).to(dtype_);
    at::Tensor g = b.wi(h);
    if (cfg_.gated()) {
      const auto parts = g.chunk(2, -1);
      g = ffn_act(parts[0]).mul_(parts[1]);
    } else {
      g = ffn_act(g);
    }
    x.add_(b.wo(g));
  }
  x = at::rms_norm(x, {d}, final_norm_, cfg_.eps);
  if (!index.defined()) return x.view({B, L, d});
  return at::zeros({B * L, d}, x.options()).index_copy_(0, index, x).view({B, L, d});
}

}  // namespace vidit::text
