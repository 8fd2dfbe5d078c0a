// Wan 2.1 transformer weights in the official and the diffusers layouts (see weight_layout.h).
#include "model/weight_layout.h"

#include "model/model_info.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/tensor_stream.h"
#include "model/state_dict.h"

namespace vidit {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- the name map --------------------------------------------------------------------------------
// One row per tensor family. `whole`: the row is the full name (inside its block for block rows);
// otherwise it is a module prefix followed by "weight" or "bias".
struct NameRule {
  const char* wan;
  const char* diffusers;
  bool whole;
};

// Outside the blocks.
const NameRule kModelRules[] = {
    {"patch_embedding.", "patch_embedding.", false},
    {"text_embedding.0.", "condition_embedder.text_embedder.linear_1.", false},
    {"text_embedding.2.", "condition_embedder.text_embedder.linear_2.", false},
    {"time_embedding.0.", "condition_embedder.time_embedder.linear_1.", false},
    {"time_embedding.2.", "condition_embedder.time_embedder.linear_2.", false},
    {"time_projection.1.", "condition_embedder.time_proj.", false},
    {"head.head.", "proj_out.", false},
    {"head.modulation", "scale_shift_table", true},  // [1, 2, dim] in both
    // Image-to-video: the CLIP features' projection (LayerNorm, Linear, GELU, Linear, LayerNorm)
    // and the first-and-last-frame models' position embedding.
    {"img_emb.proj.0.", "condition_embedder.image_embedder.norm1.", false},
    {"img_emb.proj.1.", "condition_embedder.image_embedder.ff.net.0.proj.", false},
    {"img_emb.proj.3.", "condition_embedder.image_embedder.ff.net.2.", false},
    {"img_emb.proj.4.", "condition_embedder.image_embedder.norm2.", false},
    {"img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed", true},
};

// Inside blocks.N. Wan's norm3 (affine LayerNorm before cross-attention) is diffusers' norm2;
// the modulated norms (Wan norm1 / norm2, diffusers norm1 / norm3) have no parameters.
const NameRule kBlockRules[] = {
    {"self_attn.q.", "attn1.to_q.", false},
    {"self_attn.k.", "attn1.to_k.", false},
    {"self_attn.v.", "attn1.to_v.", false},
    {"self_attn.o.", "attn1.to_out.0.", false},
    {"self_attn.norm_q.", "attn1.norm_q.", false},
    {"self_attn.norm_k.", "attn1.norm_k.", false},
    {"cross_attn.q.", "attn2.to_q.", false},
    {"cross_attn.k.", "attn2.to_k.", false},
    {"cross_attn.v.", "attn2.to_v.", false},
    {"cross_attn.o.", "attn2.to_out.0.", false},
    {"cross_attn.norm_q.", "attn2.norm_q.", false},
    {"cross_attn.norm_k.", "attn2.norm_k.", false},
    {"cross_attn.k_img.", "attn2.add_k_proj.", false},  // image-to-video: the image tokens' keys,
    {"cross_attn.v_img.", "attn2.add_v_proj.", false},  // values
    {"cross_attn.norm_k_img.", "attn2.norm_added_k.", false},
    {"norm3.", "norm2.", false},
    {"ffn.0.", "ffn.net.0.proj.", false},
    {"ffn.2.", "ffn.net.2.", false},
    {"modulation", "scale_shift_table", true},  // [1, 6, dim] in both
};

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `key` renamed into the other layout, or nullopt when no row matches.
std::optional<std::string> rename(const std::string& key, bool to_diffusers) {
  std::string prefix, rest = key;
  const NameRule* begin = std::begin(kModelRules);
  const NameRule* end = std::end(kModelRules);
  if (starts_with(key, "blocks.")) {
    size_t i = 7;
    while (i < key.size() && std::isdigit(static_cast<unsigned char>(key[i]))) ++i;
    if (i == 7 || i >= key.size() || key[i] != '.') return std::nullopt;
    prefix = key.substr(0, i + 1);
    rest = key.substr(i + 1);
    begin = std::begin(kBlockRules), end = std::end(kBlockRules);
  }
  for (const NameRule* r = begin; r != end; ++r) {
    const std::string from = to_diffusers ? r->wan : r->diffusers;
    const std::string to = to_diffusers ? r->diffusers : r->wan;
    if (r->whole) {
      if (rest == from) return prefix + to;
    } else if (starts_with(rest, from)) {
      const std::string leaf = rest.substr(from.size());
      if (leaf == "weight" || leaf == "bias") return prefix + to + leaf;
    }
  }
  return std::nullopt;
}

const char* const kUnmappedHint =
    "vidit's DiT is the Wan 2.1 text- or image-to-video transformer: VACE, LoRA or other models' tensors "
    "have no place in it";

TensorMap rename_all(const TensorMap& in, bool to_diffusers, const std::string& source) {
  TensorMap out;
  std::vector<std::string> unmapped;
  for (const auto& [key, t] : in) {
    auto name = rename(key, to_diffusers);
    if (!name) {
      unmapped.push_back(key);
      continue;
    }
    VIDIT_CHECK(out.emplace(*name, t).second, "weights", source.empty() ? "" : " '" + source + "'",
                ": two tensors map to '", *name, "'");
  }
  if (unmapped.empty()) return out;
  std::ostringstream os;
  os << "weights" << (source.empty() ? "" : " '" + source + "'") << ": " << unmapped.size() << " tensor name(s) of the "
     << (to_diffusers ? "official Wan" : "diffusers") << " layout map to nothing in the "
     << (to_diffusers ? "diffusers" : "official Wan") << " layout: ";
  for (size_t i = 0; i < unmapped.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << unmapped[i] << "'";
  if (unmapped.size() > 5) os << ", ...";
  os << " (" << kUnmappedHint << ")";
  fail(os.str());
}

// ComfyUI's single files prefix every name with this.
const std::string kComfyPrefix = "model.diffusion_model.";

bool all_prefixed(const std::vector<std::string>& names) {
  if (names.empty()) return false;
  for (const auto& n : names)
    if (!starts_with(n, kComfyPrefix)) return false;
  return true;
}

// ---- files ---------------------------------------------------------------------------------------
json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot open ", what, " '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  VIDIT_CHECK(!j.is_discarded() && j.is_object(), what, " '", path, "' is not a JSON object: the file is damaged");
  return j;
}

// The tensor names in a safetensors file's header, without reading its tensors.
std::vector<std::string> safetensors_names(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VIDIT_CHECK(in, "cannot open weights file '", path, "'");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  VIDIT_CHECK(in.gcount() == 8, "'", path, "' is not a safetensors file: shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  const uint64_t size = fs::file_size(path);
  VIDIT_CHECK(n <= size - 8, "'", path, "' is truncated or not safetensors: header claims ", n, " bytes but the file has ",
              size - 8, " after the length");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  VIDIT_CHECK(uint64_t(in.gcount()) == n, "cannot read the header of '", path, "'");
  json header = json::parse(text, nullptr, false);
  VIDIT_CHECK(!header.is_discarded() && header.is_object(), "'", path, "' has a damaged safetensors header");
  std::vector<std::string> names;
  for (const auto& item : header.items())
    if (item.key() != "__metadata__") names.push_back(item.key());
  return names;
}

// weight_map of an index json, checked: key -> shard file name.
std::map<std::string, std::string> read_index(const std::string& path) {
  json j = read_json(path, "weights index");
  VIDIT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "weights index '", path,
              "' has no \"weight_map\" object: it is not a safetensors index");
  std::map<std::string, std::string> map;
  for (const auto& item : j["weight_map"].items()) {
    VIDIT_CHECK(item.value().is_string(), "weights index '", path, "': the shard of '", item.key(), "' is not a file name");
    const std::string shard = item.value().get<std::string>();
    VIDIT_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", "weights index '", path,
                "': the shard of '", item.key(), "' ('", shard, "') is not a file name in the index's folder");
    map[item.key()] = shard;
  }
  VIDIT_CHECK(!map.empty(), "weights index '", path, "' lists no tensors");
  return map;
}

const char* const kIndexName = "diffusion_pytorch_model.safetensors.index.json";
const char* const kSingleName = "diffusion_pytorch_model.safetensors";

// ---- configs -------------------------------------------------------------------------------------
int64_t get_int(const json& j, const std::string& key, int64_t def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  VIDIT_CHECK(j[key].is_number_integer(), "config '", path, "': '", key, "' must be an integer, got ", j[key].dump());
  const int64_t v = j[key].get<int64_t>();
  VIDIT_CHECK(v > 0, "config '", path, "': '", key, "' must be > 0, got ", v);
  return v;
}

double get_double(const json& j, const std::string& key, double def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  VIDIT_CHECK(j[key].is_number(), "config '", path, "': '", key, "' must be a number, got ", j[key].dump());
  const double v = j[key].get<double>();
  VIDIT_CHECK(v > 0, "config '", path, "': '", key, "' must be > 0, got ", v);
  return v;
}

Patch get_patch(const json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return {1, 2, 2};
  const json& p = j[key];
  VIDIT_CHECK(p.is_array() && p.size() == 3, "config '", path, "': '", key, "' must be 3 integers (t, h, w), got ",
              p.dump());
  Patch out;
  for (int i = 0; i < 3; ++i) {
    VIDIT_CHECK(p[i].is_number_integer() && p[i].get<int64_t>() > 0, "config '", path, "': '", key,
                "' must be 3 positive integers, got ", p.dump());
    out[i] = p[i].get<int64_t>();
  }
  return out;
}

// What every config leaves to our model alone, checked the same way.
void check_model_shapes(const ModelConfig& m, const std::string& path) {
  VIDIT_CHECK(m.dim % m.heads == 0 && (m.dim / m.heads) % 2 == 0, "config '", path, "': head size ", m.dim,
              " / ", m.heads, " must be a whole even number (RoPE rotates channel pairs)");
  VIDIT_CHECK(m.freq_dim % 2 == 0, "config '", path, "': freq_dim must be even, got ", m.freq_dim);
}

// Refuses keys outside `known` that carry a value (a feature our DiT may not have).
void refuse_unknown(const json& j, const std::set<std::string>& known, const std::string& path, const char* cls) {
  for (const auto& item : j.items()) {
    if (starts_with(item.key(), "_") || known.count(item.key()) || item.value().is_null()) continue;
    fail("config '", path, "': key '", item.key(), "' (", item.value().dump(), ") is not a ", cls,
         " setting vidit knows, so the model it describes may hold features vidit's DiT lacks; remove it "
         "if it is harmless");
  }
}

constexpr double kWanRopeTheta = 10000.0;
constexpr int64_t kWanTextLen = 512;

json diffusers_config(const ModelConfig& c) {
  return json{{"_class_name", "WanTransformer3DModel"},
              // The first diffusers release with WanTransformer3DModel; later ones read it too.
              {"_diffusers_version", "0.33.0"},
              {"added_kv_proj_dim", c.image_dim > 0 ? json(c.dim) : json(nullptr)},
              {"attention_head_dim", c.dim / c.heads},
              {"cross_attn_norm", true},
              {"eps", c.eps},
              {"ffn_dim", c.ffn_dim},
              {"freq_dim", c.freq_dim},
              {"image_dim", c.image_dim > 0 ? json(c.image_dim) : json(nullptr)},
              {"in_channels", c.in_channels},
              {"num_attention_heads", c.heads},
              {"num_layers", c.layers},
              {"out_channels", c.out_channels},
              {"patch_size", {c.patch[0], c.patch[1], c.patch[2]}},
              {"pos_embed_seq_len", c.image_pos_tokens > 0 ? json(c.image_pos_tokens) : json(nullptr)},
              {"qk_norm", "rms_norm_across_heads"},
              {"rope_max_seq_len", 1024},
              {"text_dim", c.text_dim}};
}

// A release's frame conditioning, from its channels: 2 * out + 4 in (Wan I2V's 36 = 16 + 4 + 16)
// takes the condition frames' mask and latent; a position embedding over the image tokens marks
// a first-and-last-frame model.
FrameCondition frame_condition_of(const ModelConfig& m) {
  if (m.in_channels != 2 * m.out_channels + 4) return FrameCondition::none;
  return m.image_pos_tokens > 0 ? FrameCondition::first_last_frame : FrameCondition::first_frame;
}

// Wan's model_type: image conditioning is all that tells them apart in the transformer.
const char* wan_model_type(const ModelConfig& c) {
  return c.image_pos_tokens > 0 ? "flf2v" : c.image_dim > 0 ? "i2v" : "t2v";
}

// Wan 2.1's CLIP image features (open-clip ViT-H/14's penultimate layer): their width, and the
// tokens of one image. Fixed in Wan's WanModel; diffusers' config.json states the width.
constexpr int64_t kWanImageDim = 1280;
constexpr int64_t kWanImageTokens = 257;

json wan_config(const ModelConfig& c) {
  return json{{"_class_name", "WanModel"},
              {"_diffusers_version", "0.30.0"},  // what Wan 2.1's own releases carry
              {"model_type", wan_model_type(c)},
              {"patch_size", {c.patch[0], c.patch[1], c.patch[2]}},
              {"text_len", c.text_len},
              {"in_dim", c.in_channels},
              {"dim", c.dim},
              {"ffn_dim", c.ffn_dim},
              {"freq_dim", c.freq_dim},
              {"text_dim", c.text_dim},
              {"out_dim", c.out_channels},
              {"num_heads", c.heads},
              {"num_layers", c.layers},
              {"window_size", {-1, -1}},
              {"qk_norm", true},
              {"cross_attn_norm", true},
              {"eps", c.eps}};
}

std::string shard_name(size_t i, size_t n) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "diffusion_pytorch_model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_transformer(const TensorStream& official, const ModelConfig& cfg, const std::string& out_dir,
                       uint64_t max_shard_bytes, WeightLayout layout) {
  VIDIT_CHECK(!out_dir.empty(), "write weights: no output folder given");
  VIDIT_CHECK(max_shard_bytes > 0, "write weights to '", out_dir, "': the shard size must be > 0");
  VIDIT_CHECK(cfg.rope_theta == kWanRopeTheta, "write weights to '", out_dir, "': model.rope_theta is ", cfg.rope_theta,
              " but the ", layout == WeightLayout::diffusers ? "diffusers WanTransformer3DModel" : "official WanModel",
              " always uses ", kWanRopeTheta, ", so the written model would compute something else; train with "
              "model.rope_theta = 10000 to export");
  // Wan's own config states no image width or token count: its WanModel fixes them.
  VIDIT_CHECK(layout == WeightLayout::diffusers || cfg.image_dim == 0 ||
                  (cfg.image_dim == kWanImageDim && (cfg.image_pos_tokens == 0 || cfg.image_pos_tokens == 2 * kWanImageTokens)),
              "write weights to '", out_dir, "': model.image_dim = ", cfg.image_dim, ", model.image_pos_tokens = ",
              cfg.image_pos_tokens, " cannot be written in the official layout, whose WanModel fixes them at ",
              kWanImageDim, " and ", 2 * kWanImageTokens, " (first and last frames); write the diffusers layout");
  check_transformer_weights(meta_tensors(official), cfg, "the weights to write to '" + out_dir + "'");
  const fs::path out = fs::path(out_dir).lexically_normal();
  const fs::path target = out.has_filename() ? out : out.parent_path();  // "dir/" -> "dir"
  if (fs::exists(target)) {
    VIDIT_CHECK(fs::is_directory(target), "write weights: '", target.string(), "' exists and is not a folder");
    VIDIT_CHECK(fs::is_empty(target), "write weights: '", target.string(),
                "' exists and is not empty; give a new folder (nothing there was changed)");
  }

  // Tensors in the model's order, under the layout's names, cut into shards greedily: each shard
  // maps its file's names to the official ones. Only shapes are needed here.
  std::vector<std::map<std::string, std::string>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const auto& [name, shape] : transformer_shapes(cfg)) {
    const uint64_t bytes = official.info.at(name).bytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) shards.emplace_back(), shard_bytes = 0;
    shards.back().emplace(layout == WeightLayout::diffusers ? diffusers_name(name) : name, name);
    shard_bytes += bytes, total += bytes;
  }

  const fs::path tmp = target.parent_path() / (target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  try {
    if (!target.parent_path().empty()) fs::create_directories(target.parent_path());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    const json config = layout == WeightLayout::diffusers ? diffusers_config(cfg) : wan_config(cfg);
    write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shards.size() == 1 ? kSingleName : shard_name(i, shards.size());
      // The shard's tensors under the file's names, each read from `official` when it is written.
      const std::map<std::string, std::string>& names = shards[i];
      TensorStream part;
      for (const auto& [name, from] : names) part.info.emplace(name, official.info.at(from)), weight_map[name] = file;
      part.read = [&official, &names](const std::string& name) { return official.get(names.at(name)); };
      save_safetensors((tmp / file).string(), part, {{"format", "pt"}});
    }
    if (shards.size() > 1) {
      const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      write_file_atomic((tmp / kIndexName).string(), index.dump(2) + "\n");
    }
    if (fs::exists(target)) fs::remove(target);  // empty (checked above)
    fs::rename(tmp, target);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fail("write weights to '", target.string(), "' failed (nothing was left there): ", e.what());
  }
}

}  // namespace

const char* layout_name(WeightLayout layout) { return layout == WeightLayout::wan ? "wan" : "diffusers"; }

std::string diffusers_name(const std::string& official, const std::string& source) {
  auto name = rename(official, true);
  VIDIT_CHECK(name, "weights", source.empty() ? "" : " '" + source + "'", ": official Wan tensor '", official,
              "' has no diffusers name (", kUnmappedHint, ")");
  return *name;
}

std::string official_name(const std::string& diffusers, const std::string& source) {
  auto name = rename(diffusers, false);
  VIDIT_CHECK(name, "weights", source.empty() ? "" : " '" + source + "'", ": diffusers tensor '", diffusers,
              "' has no official Wan name (", kUnmappedHint, ")");
  return *name;
}

TensorMap to_diffusers_names(const TensorMap& official, const std::string& source) {
  return rename_all(official, true, source);
}

TensorMap to_official_names(const TensorMap& diffusers, const std::string& source) {
  return rename_all(diffusers, false, source);
}

WeightLayout layout_of_names(const std::vector<std::string>& names, const std::string& source) {
  // A name valid in one layout only is evidence for it (patch_embedding.* is valid in both).
  const std::string* wan = nullptr;
  const std::string* diffusers = nullptr;
  for (const auto& n : names) {
    const bool as_wan = rename(n, true).has_value(), as_diffusers = rename(n, false).has_value();
    if (as_wan && !as_diffusers && !wan) wan = &n;
    if (as_diffusers && !as_wan && !diffusers) diffusers = &n;
  }
  VIDIT_CHECK(!(wan && diffusers), "weights '", source, "' mix the official Wan layout ('", *wan,
              "') and the diffusers layout ('", *diffusers, "'): give one model's files");
  return diffusers ? WeightLayout::diffusers : WeightLayout::wan;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> transformer_shapes(const ModelConfig& c) {
  return parameter_shapes(c);
}

void check_transformer_weights(const TensorMap& official, const ModelConfig& cfg, const std::string& source) {
  TensorMap expected;
  for (const auto& [name, shape] : transformer_shapes(cfg))
    expected.emplace(name, at::empty(shape, at::TensorOptions().device(at::kMeta)));
  check_state_dict(expected, official, source);
}

WeightFiles find_transformer_weights(const std::string& path) {
  VIDIT_CHECK(!path.empty() && fs::exists(path), "weights '", path,
              "' not found: give a .safetensors file, a folder of them (an official Wan release, a diffusers "
              "transformer/ folder) or a diffusers pipeline folder");
  WeightFiles w;
  fs::path dir(path);
  if (!fs::is_directory(dir)) {
    w.dir = dir.parent_path().string();
    if (ends_with(path, ".index.json"))
      w.index = path;
    else
      w.files = {path};
  } else {
    if (fs::exists(dir / "model_index.json")) {
      VIDIT_CHECK(fs::is_directory(dir / "transformer"), "'", path,
                  "' is a diffusers pipeline (model_index.json) without a transformer/ folder");
      dir /= "transformer";
    }
    w.dir = dir.string();
    std::vector<std::string> indexes, files;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (ends_with(name, ".safetensors.index.json")) indexes.push_back(e.path().string());
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    // diffusers' own names first: a folder may hold variants (diffusion_pytorch_model.fp16.*) beside them.
    if (fs::exists(dir / kIndexName))
      w.index = (dir / kIndexName).string();
    else if (fs::exists(dir / kSingleName))
      w.files = {(dir / kSingleName).string()};
    else if (indexes.size() == 1)
      w.index = indexes[0];
    else
      w.files = files;
    VIDIT_CHECK(!w.index.empty() || !w.files.empty(), "folder '", dir.string(), "' holds no .safetensors files");
  }
  std::vector<std::string> names;
  if (!w.index.empty()) {
    std::set<std::string> shards;
    for (const auto& [key, shard] : read_index(w.index)) names.push_back(key), shards.insert(shard);
    for (const auto& s : shards) w.files.push_back((fs::path(w.dir) / s).string());
  } else {
    for (const auto& f : w.files)
      for (auto& n : safetensors_names(f)) names.push_back(std::move(n));
  }
  if (all_prefixed(names))
    for (auto& n : names) n = n.substr(kComfyPrefix.size());
  w.layout = layout_of_names(names, path);
  w.names = std::move(names);
  const fs::path config = fs::path(w.dir) / "config.json";
  if (fs::exists(config)) w.config = config.string();
  return w;
}

TensorMap read_transformer_weights(const std::string& path, std::vector<std::shared_ptr<const MappedFile>>* mapped) {
  const WeightFiles w = find_transformer_weights(path);
  auto load_safetensors = [mapped](const std::string& file) {
    if (!mapped) return vidit::load_safetensors(file);
    std::shared_ptr<const MappedFile> m;
    TensorMap t = map_safetensors(file, &m);
    mapped->push_back(std::move(m));
    return t;
  };
  TensorMap all;
  if (!w.index.empty()) {
    std::map<std::string, std::vector<std::string>> by_shard;
    for (const auto& [key, shard] : read_index(w.index)) by_shard[shard].push_back(key);
    for (const auto& [shard, keys] : by_shard) {
      const std::string file = (fs::path(w.dir) / shard).string();
      VIDIT_CHECK(fs::exists(file), "shard '", file, "' is missing: '", w.index, "' lists ", keys.size(),
                  " tensor(s) in it (e.g. '", keys.front(), "'); download it again or fix the index");
      TensorMap tensors = load_safetensors(file);
      for (const auto& key : keys) {
        auto it = tensors.find(key);
        VIDIT_CHECK(it != tensors.end(), "tensor '", key, "' is missing from shard '", file, "', where '", w.index,
                    "' says it is; the shard is damaged or from another model");
        all.emplace(key, std::move(it->second));
      }
    }
  } else {
    for (const auto& file : w.files)
      for (auto& [key, t] : load_safetensors(file)) {
        VIDIT_CHECK(!all.count(key), "key '", key, "' appears in two shards of '", path, "' (second: ",
                    fs::path(file).filename().string(), ")");
        all.emplace(key, std::move(t));
      }
  }
  std::vector<std::string> names;
  for (const auto& [key, t] : all) names.push_back(key);
  if (all_prefixed(names)) {
    TensorMap stripped;
    for (auto& [key, t] : all) stripped.emplace(key.substr(kComfyPrefix.size()), std::move(t));
    all = std::move(stripped);
  }
  if (w.layout == WeightLayout::diffusers) return to_official_names(all, path);
  return all;
}

ModelConfig model_config_from_diffusers(const std::string& path) {
  const json j = read_json(path, "diffusers transformer config");
  if (j.contains("_class_name"))
    VIDIT_CHECK(j["_class_name"] == "WanTransformer3DModel", "config '", path, "' describes a ",
                j["_class_name"].dump(), ", not a WanTransformer3DModel");
  refuse_unknown(j,
                 {"patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
                  "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "image_dim",
                  "added_kv_proj_dim", "rope_max_seq_len", "pos_embed_seq_len"},
                 path, "WanTransformer3DModel");
  if (j.contains("cross_attn_norm"))
    VIDIT_CHECK(j["cross_attn_norm"] == true, "config '", path,
                "': cross_attn_norm is off; vidit's DiT always has the affine LayerNorm before cross-attention");
  if (j.contains("qk_norm") && !j["qk_norm"].is_null())
    VIDIT_CHECK(j["qk_norm"] == "rms_norm_across_heads", "config '", path, "': qk_norm ", j["qk_norm"].dump(),
                " is not supported; vidit's DiT has \"rms_norm_across_heads\"");
  ModelConfig m;
  // Defaults: WanTransformer3DModel's constructor (the 14B model), as diffusers fills them.
  m.heads = get_int(j, "num_attention_heads", 40, path);
  m.dim = m.heads * get_int(j, "attention_head_dim", 128, path);
  m.in_channels = get_int(j, "in_channels", 16, path);
  m.out_channels = j.contains("out_channels") && j["out_channels"] == 0 ? m.in_channels
                                                                        : get_int(j, "out_channels", m.in_channels, path);
  m.text_dim = get_int(j, "text_dim", 4096, path);
  m.freq_dim = get_int(j, "freq_dim", 256, path);
  m.ffn_dim = get_int(j, "ffn_dim", 13824, path);
  m.layers = get_int(j, "num_layers", 40, path);
  m.eps = get_double(j, "eps", 1e-6, path);
  m.patch = get_patch(j, "patch_size", path);
  m.text_len = kWanTextLen;       // WanPipeline pads prompts with zeros to max_sequence_length = 512
  m.rope_theta = kWanRopeTheta;  // WanRotaryPosEmbed's fixed theta
  // Image-to-video: the CLIP features' width; the image keys and values project from the model's
  // own width (the image embedding's output), the only added_kv_proj_dim our DiT has.
  m.image_dim = j.contains("image_dim") && !j["image_dim"].is_null() ? get_int(j, "image_dim", 0, path) : 0;
  if (j.contains("added_kv_proj_dim") && !j["added_kv_proj_dim"].is_null()) {
    VIDIT_CHECK(m.image_dim > 0, "config '", path, "': added_kv_proj_dim is set but image_dim is not");
    VIDIT_CHECK(get_int(j, "added_kv_proj_dim", 0, path) == m.dim, "config '", path, "': added_kv_proj_dim ",
                j["added_kv_proj_dim"].dump(), " is not the model's width ", m.dim,
                " (Wan's image keys and values read the image embedding's output)");
  } else {
    VIDIT_CHECK(m.image_dim == 0, "config '", path, "': image_dim is set but added_kv_proj_dim is not: diffusers' "
                "transformer would then embed the image and attend to it without keys and values of its own");
  }
  m.image_pos_tokens = j.contains("pos_embed_seq_len") && !j["pos_embed_seq_len"].is_null()
                           ? get_int(j, "pos_embed_seq_len", 0, path)
                           : 0;
  VIDIT_CHECK(m.image_pos_tokens == 0 || m.image_dim > 0, "config '", path,
              "': pos_embed_seq_len is set without image_dim");
  m.condition = frame_condition_of(m);
  check_model_shapes(m, path);
  return m;
}

ModelConfig model_config_from_wan(const std::string& path) {
  const json j = read_json(path, "Wan transformer config");
  if (j.contains("_class_name"))
    VIDIT_CHECK(j["_class_name"] == "WanModel", "config '", path, "' describes a ", j["_class_name"].dump(),
                ", not Wan's WanModel");
  refuse_unknown(j,
                 {"model_type", "patch_size", "text_len", "in_dim", "dim", "ffn_dim", "freq_dim", "text_dim", "out_dim",
                  "num_heads", "num_layers", "window_size", "qk_norm", "cross_attn_norm", "eps"},
                 path, "WanModel");
  const std::string type = j.value("model_type", std::string("t2v"));
  VIDIT_CHECK(type == "t2v" || type == "i2v" || type == "flf2v", "config '", path, "': model_type \"", type,
              "\" is not supported; vidit's DiT is Wan 2.1 text-to-video (\"t2v\") or image-to-video (\"i2v\", "
              "\"flf2v\")");
  if (j.contains("window_size") && !j["window_size"].is_null())
    VIDIT_CHECK(j["window_size"] == json::array({-1, -1}), "config '", path, "': window_size ", j["window_size"].dump(),
                " (local attention) is not supported; vidit's DiT attends globally ([-1, -1])");
  for (const char* key : {"qk_norm", "cross_attn_norm"})
    if (j.contains(key))
      VIDIT_CHECK(j[key] == true, "config '", path, "': '", key, "' is off; vidit's DiT always has it");
  ModelConfig m;
  // Defaults: WanModel's constructor, as Wan fills them.
  m.dim = get_int(j, "dim", 2048, path);
  m.ffn_dim = get_int(j, "ffn_dim", 8192, path);
  m.freq_dim = get_int(j, "freq_dim", 256, path);
  m.in_channels = get_int(j, "in_dim", 16, path);
  m.out_channels = get_int(j, "out_dim", 16, path);
  m.heads = get_int(j, "num_heads", 16, path);
  m.layers = get_int(j, "num_layers", 32, path);
  m.text_dim = get_int(j, "text_dim", 4096, path);
  m.text_len = get_int(j, "text_len", kWanTextLen, path);
  m.eps = get_double(j, "eps", 1e-6, path);
  m.patch = get_patch(j, "patch_size", path);
  m.rope_theta = kWanRopeTheta;
  if (type != "t2v") m.image_dim = kWanImageDim;
  if (type == "flf2v") m.image_pos_tokens = 2 * kWanImageTokens;
  m.condition = frame_condition_of(m);
  check_model_shapes(m, path);
  return m;
}

ModelConfig read_transformer_config(const std::string& path) {
  const WeightFiles w = find_transformer_weights(path);
  VIDIT_CHECK(!w.config.empty(), "weights '", path, "' have no config.json beside them (in '", w.dir,
              "'): set the model.* keys by hand");
  const json j = read_json(w.config, "transformer config");
  const std::string cls = j.contains("_class_name") && j["_class_name"].is_string() ? j["_class_name"].get<std::string>() : "";
  if (cls == "WanTransformer3DModel" || (cls.empty() && j.contains("num_attention_heads")))
    return model_config_from_diffusers(w.config);
  if (cls == "WanModel" || (cls.empty() && j.contains("num_heads"))) {
    ModelConfig m = model_config_from_wan(w.config);
    // Wan 2.2's image-to-video experts say model_type "i2v" but attend to no CLIP features.
    const bool clip = std::any_of(w.names.begin(), w.names.end(), [](const std::string& n) {
      return n.rfind("img_emb.", 0) == 0;
    });
    if (m.image_dim > 0 && !clip) m.image_dim = 0, m.image_pos_tokens = 0;
    return m;
  }
  fail("config '", w.config, "' describes a '", cls, "', neither diffusers' WanTransformer3DModel nor Wan's WanModel");
}

void write_diffusers_transformer(const TensorStream& official, const ModelConfig& cfg, const std::string& out_dir,
                                 uint64_t max_shard_bytes) {
  write_transformer(official, cfg, out_dir, max_shard_bytes, WeightLayout::diffusers);
}

void write_wan_transformer(const TensorStream& official, const ModelConfig& cfg, const std::string& out_dir,
                           uint64_t max_shard_bytes) {
  write_transformer(official, cfg, out_dir, max_shard_bytes, WeightLayout::wan);
}

void write_diffusers_transformer(const TensorMap& official, const ModelConfig& cfg, const std::string& out_dir,
                                 uint64_t max_shard_bytes) {
  write_transformer(stream_of(official), cfg, out_dir, max_shard_bytes, WeightLayout::diffusers);
}

void write_wan_transformer(const TensorMap& official, const ModelConfig& cfg, const std::string& out_dir,
                           uint64_t max_shard_bytes) {
  write_transformer(stream_of(official), cfg, out_dir, max_shard_bytes, WeightLayout::wan);
}

}  // namespace vidit
