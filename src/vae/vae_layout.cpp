#include "vae/vae_layout.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "model/state_dict.h"

namespace vidit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

const char* const kClassName = "AutoencoderKLWan";
const char* const kWeightsName = "diffusion_pytorch_model.safetensors";
const char* const kWeightsFp16Name = "diffusion_pytorch_model.fp16.safetensors";
const char* const kOfficialName = "Wan2.1_VAE.safetensors";

// Inside a residual block: official nn.Sequential indices -> diffusers' attribute names. Names
// of the attention block (norm, to_qkv, proj) and of a Resample (resample.1, time_conv) are the
// same in both layouts.
std::string block_leaf(const std::string& rest) {
  static const std::pair<const char*, const char*> kLeaf[] = {{"residual.0.", "norm1."},
                                                              {"residual.2.", "conv1."},
                                                              {"residual.3.", "norm2."},
                                                              {"residual.6.", "conv2."},
                                                              {"shortcut.", "conv_shortcut."}};
  for (const auto& [official, diffusers] : kLeaf)
    if (starts_with(rest, official)) return diffusers + rest.substr(std::strlen(official));
  return rest;
}

// "N.rest" -> N and rest.
std::pair<int64_t, std::string> split_index(const std::string& s, const std::string& whole) {
  const size_t dot = s.find('.');
  VIDIT_CHECK(dot != std::string::npos && dot > 0, "VAE parameter '", whole, "' has no layer index");
  return {std::stoll(s.substr(0, dot)), s.substr(dot + 1)};
}

// An official name of WanVAE(cfg) -> its diffusers name (see vae_layout.h).
std::string to_diffusers(const std::string& key, const WanVAEConfig& cfg) {
  if (starts_with(key, "conv1.")) return "quant_conv." + key.substr(6);
  if (starts_with(key, "conv2.")) return "post_quant_conv." + key.substr(6);
  const bool enc = starts_with(key, "encoder."), dec = starts_with(key, "decoder.");
  VIDIT_CHECK(enc || dec, "VAE parameter '", key, "' is not in the encoder or decoder");
  const std::string part = key.substr(0, 8), rest = key.substr(8);
  if (starts_with(rest, "conv1.")) return part + "conv_in." + rest.substr(6);
  if (starts_with(rest, "head.0.")) return part + "norm_out." + rest.substr(7);
  if (starts_with(rest, "head.2.")) return part + "conv_out." + rest.substr(7);
  if (starts_with(rest, "middle.")) {
    const auto [i, leaf] = split_index(rest.substr(7), key);
    if (i == 1) return part + "mid_block.attentions.0." + leaf;
    return part + "mid_block.resnets." + std::to_string(i / 2) + "." + block_leaf(leaf);
  }
  if (enc && starts_with(rest, "downsamples.")) {
    const auto [i, leaf] = split_index(rest.substr(12), key);
    return part + "down_blocks." + std::to_string(i) + "." + block_leaf(leaf);
  }
  if (dec && starts_with(rest, "upsamples.")) {
    // Each decoder stage: num_res_blocks + 1 residual blocks, then (all but the last) a Resample.
    const auto [i, leaf] = split_index(rest.substr(10), key);
    const int64_t per = cfg.num_res_blocks + 2, stage = i / per, j = i % per;
    if (j <= cfg.num_res_blocks)
      return part + "up_blocks." + std::to_string(stage) + ".resnets." + std::to_string(j) + "." + block_leaf(leaf);
    return part + "up_blocks." + std::to_string(stage) + ".upsamplers.0." + leaf;
  }
  fail("VAE parameter '", key, "' has no diffusers name");
}

// Prefixes only one layout uses (the leading part of a name decides).
const std::vector<std::string>& diffusers_prefixes() {
  static const std::vector<std::string> p = {
      "quant_conv.",           "post_quant_conv.",     "encoder.conv_in.",   "decoder.conv_in.",
      "encoder.down_blocks.",  "decoder.up_blocks.",   "encoder.mid_block.", "decoder.mid_block.",
      "encoder.norm_out.",     "decoder.norm_out.",    "encoder.conv_out.",  "decoder.conv_out."};
  return p;
}
const std::vector<std::string>& official_prefixes() {
  static const std::vector<std::string> p = {
      "conv1.",          "conv2.",          "encoder.conv1.", "decoder.conv1.", "encoder.downsamples.",
      "decoder.upsamples.", "encoder.middle.", "decoder.middle.", "encoder.head.", "decoder.head."};
  return p;
}
bool has_prefix(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (starts_with(name, p)) return true;
  return false;
}

std::string shape_hint(const WanVAEConfig& cfg) {
  std::ostringstream os;
  os << "\n  (the Wan 2.1 VAE built here has base_dim " << cfg.base_dim << ", z_dim " << cfg.z_dim << ", "
     << cfg.dim_mult.size() << " stages, " << cfg.num_res_blocks << " residual blocks per stage)";
  return os.str();
}

// Renames `tensors` from the names `from` gives to the names `to` gives, strictly.
TensorMap rename(const TensorMap& tensors, const WanVAEConfig& cfg, const std::string& source, bool from_diffusers) {
  const std::vector<VaeParam> params = vae_params(cfg);
  TensorMap expected;
  for (const auto& p : params)
    expected[from_diffusers ? p.diffusers : p.official] = at::empty(p.shape, at::TensorOptions().device(at::kMeta));
  try {
    check_state_dict(expected, tensors, source);
  } catch (const Error& e) {
    fail(e.what(), " (", from_diffusers ? "diffusers' AutoencoderKLWan names" : "official Wan VAE names", ")",
         shape_hint(cfg));
  }
  TensorMap out;
  for (const auto& p : params)
    out[from_diffusers ? p.official : p.diffusers] = tensors.at(from_diffusers ? p.diffusers : p.official);
  return out;
}

}  // namespace

json read_vae_config_json(const std::string& path) {
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot open VAE config '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  VIDIT_CHECK(!j.is_discarded() && j.is_object(), "VAE config '", path, "' is not a JSON object: the file is damaged");
  return j;
}

namespace {

// The _class_name of a config.json, or "" when it has none or cannot be read.
std::string class_name_of(const fs::path& config) {
  std::ifstream in(config);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("_class_name") || !j["_class_name"].is_string()) return "";
  return j["_class_name"].get<std::string>();
}

std::string pth_hint(const std::string& pth) {
  return "convert it once: python -c \"import torch, safetensors.torch as s; s.save_file(torch.load('" + pth +
         "', map_location='cpu'), 'Wan2.1_VAE.safetensors')\"";
}

// A file named by the user: a pickle gets the conversion it needs.
void refuse_pickle(const fs::path& p) {
  const std::string ext = p.extension().string();
  VIDIT_CHECK(ext != ".pth" && ext != ".pt" && ext != ".ckpt", "VAE weights '", p.string(), "' are a pickle, which "
              "vidit does not read; ", pth_hint(p.string()));
  VIDIT_CHECK(ext != ".bin", "VAE weights '", p.string(), "' are a PyTorch pickle (diffusers' old format), which vidit "
              "does not read; re-save the VAE with AutoencoderKLWan.from_pretrained(...).save_pretrained(DIR) "
              "(safetensors by default) and give DIR");
}

int64_t get_int(const json& j, const char* key, int64_t def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  VIDIT_CHECK(j[key].is_number_integer(), "VAE config '", path, "': '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

template <typename T, typename Check>
std::vector<T> get_list(const json& j, const char* key, std::vector<T> def, const std::string& path, Check ok,
                        const char* what) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const json& v = j[key];
  VIDIT_CHECK(v.is_array(), "VAE config '", path, "': '", key, "' must be a list of ", what, ", got ", v.dump());
  std::vector<T> out;
  for (const json& e : v) {
    VIDIT_CHECK(ok(e), "VAE config '", path, "': '", key, "' must be a list of ", what, ", got ", v.dump());
    out.push_back(e.get<T>());
  }
  return out;
}

template <typename T>
std::string list_text(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    os << (i ? ", " : "");
    if constexpr (std::is_same_v<T, bool>) {
      os << (v[i] ? "true" : "false");
    } else {
      os << v[i];
    }
  }
  os << "]";
  return os.str();
}

bool same_stats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-6f * std::max(1.0f, std::abs(b[i]))) return false;
  return true;
}

}  // namespace

std::vector<VaeParam> vae_params(const WanVAEConfig& cfg) {
  WanVAE meta(cfg, at::TensorOptions().device(at::kMeta));
  std::vector<VaeParam> out;
  for (const auto& item : meta->named_parameters(true))
    out.push_back({item.key(), to_diffusers(item.key(), cfg), item.value().sizes().vec()});
  return out;
}

VaeLayout vae_layout_of(const TensorMap& tensors, const std::string& source) {
  std::string diffusers, official;
  for (const auto& [name, t] : tensors) {
    if (diffusers.empty() && has_prefix(name, diffusers_prefixes())) diffusers = name;
    if (official.empty() && has_prefix(name, official_prefixes())) official = name;
  }
  VIDIT_CHECK(diffusers.empty() || official.empty(), "VAE weights '", source, "' mix the official Wan VAE names (e.g. '",
              official, "') and diffusers' AutoencoderKLWan names (e.g. '", diffusers,
              "'): the file is damaged or two files were merged; give one VAE in one layout");
  return diffusers.empty() ? VaeLayout::wan : VaeLayout::diffusers;
}

TensorMap vae_to_official_names(const TensorMap& diffusers, const WanVAEConfig& cfg, const std::string& source) {
  return rename(diffusers, cfg, source, /*from_diffusers=*/true);
}

TensorMap vae_to_diffusers_names(const TensorMap& official, const WanVAEConfig& cfg, const std::string& source) {
  return rename(official, cfg, source, /*from_diffusers=*/false);
}

VaeFiles find_vae_files(const std::string& path) {
  const fs::path p(path);
  VIDIT_CHECK(!path.empty() && fs::exists(p), "VAE weights '", path, "' do not exist: give the VAE's .safetensors "
              "file, a diffusers vae/ folder or a diffusers pipeline folder (model_index.json)");
  if (!fs::is_directory(p)) {
    refuse_pickle(p);
    VaeFiles f{p.string(), ""};
    const fs::path config = p.parent_path() / "config.json";
    if (class_name_of(config) == kClassName) f.config = config.string();
    return f;
  }
  fs::path dir = p;
  if (fs::exists(dir / "model_index.json")) {
    VIDIT_CHECK(fs::is_directory(dir / "vae"), "VAE weights '", path, "' is a diffusers pipeline folder without vae/: "
                "give the VAE with --vae FILE (or data.vae_weights)");
    dir /= "vae";
  }
  const std::string cls = class_name_of(dir / "config.json");
  for (const char* name : {kWeightsName, kWeightsFp16Name}) {
    if (!fs::is_regular_file(dir / name)) continue;
    // Without config.json the tensors' names and shapes alone are checked.
    if (!fs::exists(dir / "config.json")) return {(dir / name).string(), ""};
    VIDIT_CHECK(cls == kClassName, "VAE weights '", path, "': folder '", dir.string(), "' holds a model of class '", cls,
                "' (", (dir / "config.json").string(), "), not diffusers' ", kClassName,
                " (the Wan 2.1 VAE); give the VAE's vae/ folder or its .safetensors file");
    return {(dir / name).string(), (dir / "config.json").string()};
  }
  if (fs::is_regular_file(dir / kOfficialName)) return {(dir / kOfficialName).string(), ""};
  VIDIT_CHECK(!fs::is_regular_file(dir / "Wan2.1_VAE.pth"), "VAE weights '", path, "': folder '", dir.string(),
              "' has Wan2.1_VAE.pth, a pickle vidit does not read; ", pth_hint((dir / "Wan2.1_VAE.pth").string()));
  VIDIT_CHECK(!fs::is_regular_file(dir / "diffusion_pytorch_model.bin"), "VAE weights '", path, "': folder '",
              dir.string(), "' has only diffusion_pytorch_model.bin, a pickle vidit does not read; re-save it with "
              "AutoencoderKLWan.from_pretrained(DIR).save_pretrained(DIR) (safetensors by default)");
  fail("VAE weights '", path, "': folder '", dir.string(), "' has no ", kWeightsName, " (diffusers' vae/) and no ",
       kOfficialName, " (official): give the VAE's .safetensors file, its vae/ folder or the pipeline folder");
}

WanVAEConfig vae_config_from_diffusers(const std::string& path) {
  const json j = read_vae_config_json(path);
  if (j.contains("_class_name")) {
    const std::string cls = j["_class_name"].is_string() ? j["_class_name"].get<std::string>() : j["_class_name"].dump();
    VIDIT_CHECK(cls == kClassName, "VAE config '", path, "' describes a model of class '", cls, "', not diffusers' ", kClassName,
                " (the Wan 2.1 VAE): give the pipeline's vae/ folder");
  }
  static const std::set<std::string> known = {
      "base_dim",     "decoder_base_dim", "z_dim",       "dim_mult",   "num_res_blocks", "attn_scales",
      "temperal_downsample", "dropout",   "latents_mean", "latents_std", "is_residual",  "in_channels",
      "out_channels", "patch_size",       "scale_factor_temporal", "scale_factor_spatial"};
  for (const auto& item : j.items()) {
    if (starts_with(item.key(), "_") || known.count(item.key()) || item.value().is_null()) continue;
    fail("VAE config '", path, "': key '", item.key(), "' (", item.value().dump(), ") is not an ", kClassName,
         " setting vidit knows, so the VAE it describes may have parts vidit's lacks; remove it if it is harmless");
  }
  auto is_int = [](const json& e) { return e.is_number_integer(); };
  auto is_bool = [](const json& e) { return e.is_boolean(); };
  auto is_num = [](const json& e) { return e.is_number(); };
  WanVAEConfig c;
  c.base_dim = get_int(j, "base_dim", c.base_dim, path);
  c.z_dim = get_int(j, "z_dim", c.z_dim, path);
  c.num_res_blocks = get_int(j, "num_res_blocks", c.num_res_blocks, path);
  c.dim_mult = get_list<int64_t>(j, "dim_mult", c.dim_mult, path, is_int, "integers");
  c.temporal_downsample = get_list<bool>(j, "temperal_downsample", c.temporal_downsample, path, is_bool, "booleans");
  c.latent_mean = get_list<float>(j, "latents_mean", c.latent_mean, path, is_num, "numbers");
  c.latent_std = get_list<float>(j, "latents_std", c.latent_std, path, is_num, "numbers");

  const int64_t decoder_base = get_int(j, "decoder_base_dim", c.base_dim, path);
  VIDIT_CHECK(decoder_base == c.base_dim, "VAE config '", path, "': decoder_base_dim ", decoder_base, " differs from base_dim ",
              c.base_dim, "; vidit's WanVAE has one width for encoder and decoder (Wan 2.1's)");
  VIDIT_CHECK(get_list<double>(j, "attn_scales", {}, path, is_num, "numbers").empty(), "VAE config '", path,
              "': attn_scales ", j["attn_scales"].dump(), " adds attention blocks to the stages; Wan 2.1's VAE has "
              "none (attn_scales = []) and vidit's WanVAE neither");
  VIDIT_CHECK(!j.contains("is_residual") || j["is_residual"].is_null() || j["is_residual"] == false, "VAE config '", path,
              "': is_residual = ", j["is_residual"].dump(), " is Wan 2.2's VAE; vidit reads Wan 2.1's VAE only");
  VIDIT_CHECK(!j.contains("patch_size") || j["patch_size"].is_null(), "VAE config '", path, "': patch_size ",
              j.value("patch_size", json()).dump(), " is Wan 2.2's VAE; vidit reads Wan 2.1's VAE only");
  for (const char* key : {"in_channels", "out_channels"}) {
    const int64_t v = get_int(j, key, 3, path);
    VIDIT_CHECK(v == 3, "VAE config '", path, "': ", key, " = ", v, "; vidit's WanVAE codes RGB video (3 channels)");
  }
  if (j.contains("dropout") && !j["dropout"].is_null())
    VIDIT_CHECK(j["dropout"].is_number(), "VAE config '", path, "': 'dropout' must be a number, got ", j["dropout"].dump());
  try {
    c.validate();
  } catch (const Error& e) {
    fail("VAE config '", path, "': ", e.what());
  }
  const int64_t tf = get_int(j, "scale_factor_temporal", c.temporal_factor(), path);
  const int64_t sf = get_int(j, "scale_factor_spatial", c.spatial_factor(), path);
  VIDIT_CHECK(tf == c.temporal_factor() && sf == c.spatial_factor(), "VAE config '", path, "': scale_factor_temporal ",
              tf, " / scale_factor_spatial ", sf, " disagree with the stages (dim_mult, temperal_downsample), which "
              "compress ", c.temporal_factor(), "x in time and ", c.spatial_factor(), "x in space");
  return c;
}

void check_vae_config(const WanVAEConfig& found, const WanVAEConfig& built, const std::string& source) {
  auto differ = [&](const char* key, const std::string& file_value, const std::string& built_value) {
    fail("VAE config '", source, "': ", key, " is ", file_value, " but the WanVAE being loaded has ", built_value,
         ", so this is not the VAE vidit builds (Wan 2.1's: base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4], "
         "num_res_blocks 2, temperal_downsample [false, true, true], Wan 2.1's latents_mean / latents_std); give "
         "the Wan 2.1 VAE");
  };
  if (found.base_dim != built.base_dim) differ("base_dim", std::to_string(found.base_dim), std::to_string(built.base_dim));
  if (found.z_dim != built.z_dim) differ("z_dim", std::to_string(found.z_dim), std::to_string(built.z_dim));
  if (found.dim_mult != built.dim_mult) differ("dim_mult", list_text(found.dim_mult), list_text(built.dim_mult));
  if (found.num_res_blocks != built.num_res_blocks)
    differ("num_res_blocks", std::to_string(found.num_res_blocks), std::to_string(built.num_res_blocks));
  if (found.temporal_downsample != built.temporal_downsample)
    differ("temperal_downsample", list_text(found.temporal_downsample), list_text(built.temporal_downsample));
  // The statistics are not weights, but encode_latents / decode_latents normalise with them.
  if (!same_stats(found.latent_mean, built.latent_mean))
    differ("latents_mean", list_text(found.latent_mean), list_text(built.latent_mean));
  if (!same_stats(found.latent_std, built.latent_std))
    differ("latents_std", list_text(found.latent_std), list_text(built.latent_std));
}

void write_diffusers_vae(const TensorMap& official, const WanVAEConfig& cfg, const std::string& out_dir) {
  cfg.validate();
  VIDIT_CHECK(!cfg.latent_mean.empty(), "writing a diffusers VAE to '", out_dir, "': the config has no latent "
              "statistics, and AutoencoderKLWan would take Wan 2.1's in their place");
  const TensorMap renamed = vae_to_diffusers_names(official, cfg, "<VAE being written to " + out_dir + ">");
  VIDIT_CHECK(!fs::exists(out_dir) || (fs::is_directory(out_dir) && fs::is_empty(out_dir)), "cannot write the VAE to '",
              out_dir, "': it exists and is not an empty folder");
  json config = {{"_class_name", kClassName},
                 {"_diffusers_version", "0.33.0"},  // the first release with AutoencoderKLWan
                 {"attn_scales", json::array()},
                 {"base_dim", cfg.base_dim},
                 {"decoder_base_dim", nullptr},
                 {"dim_mult", cfg.dim_mult},
                 {"dropout", 0.0},
                 {"latents_mean", cfg.latent_mean},
                 {"latents_std", cfg.latent_std},
                 {"num_res_blocks", cfg.num_res_blocks},
                 {"temperal_downsample", cfg.temporal_downsample},
                 {"z_dim", cfg.z_dim}};
  // Written into a sibling folder renamed at the end: a failure leaves no half-written out_dir.
  const fs::path out = fs::path(out_dir).lexically_normal();
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
  save_safetensors((tmp / kWeightsName).string(), renamed);
  if (fs::exists(out)) fs::remove(out);  // empty, checked above
  fs::rename(tmp, out);
}

}  // namespace vidit
