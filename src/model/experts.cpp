// Two-expert releases: finding the experts and their boundary (see experts.h).
#include "model/experts.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/weight_layout.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool names_component(const json& j, const char* key) {
  return j.contains(key) && j[key].is_array() && j[key].size() == 2 && j[key][0].is_string();
}

// The fields that make two DiTs the same shape.
bool same_shape(const ModelConfig& a, const ModelConfig& b) {
  return a.dim == b.dim && a.ffn_dim == b.ffn_dim && a.heads == b.heads && a.layers == b.layers &&
         a.in_channels == b.in_channels && a.out_channels == b.out_channels && a.patch == b.patch &&
         a.text_dim == b.text_dim && a.freq_dim == b.freq_dim && a.image_dim == b.image_dim &&
         a.image_pos_tokens == b.image_pos_tokens;
}

std::string shape_text(const ModelConfig& m) {
  return "dim " + std::to_string(m.dim) + ", " + std::to_string(m.layers) + " layers, " + std::to_string(m.heads) +
         " heads, ffn " + std::to_string(m.ffn_dim) + ", " + std::to_string(m.in_channels) + " -> " +
         std::to_string(m.out_channels) + " channels";
}

}  // namespace

std::optional<ExpertRelease> find_experts(const std::string& root_path) {
  const fs::path root(root_path);
  std::error_code ec;
  if (root_path.empty() || !fs::is_directory(root, ec)) return std::nullopt;
  ExpertRelease r;
  const fs::path index = root / "model_index.json";
  if (fs::is_regular_file(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("'", index.string(), "' is not valid JSON (", e.what(), ")");
    }
    if (!names_component(j, "transformer_2")) return std::nullopt;
    VIDIT_CHECK(names_component(j, "transformer"), "'", index.string(), "' names transformer_2 (the low-noise "
                "expert) but no transformer (the high-noise one); vidit samples and trains both experts of a release");
    VIDIT_CHECK(j.contains("boundary_ratio") && j["boundary_ratio"].is_number(), "'", index.string(), "' has two "
                "transformers but no boundary_ratio, so which one serves which noise level is unknown; add "
                "\"boundary_ratio\": 0.875 (Wan 2.2 text-to-video) or 0.9 (image-to-video)");
    r.boundary = j["boundary_ratio"].get<double>();
    VIDIT_CHECK(r.boundary > 0 && r.boundary < 1, "'", index.string(), "': boundary_ratio ", r.boundary,
                " must be in (0, 1): the noise level where the low-noise expert takes over");
    r.boundary_from = index.string();
    r.high = (root / "transformer").string(), r.low = (root / "transformer_2").string();
  } else if (fs::is_directory(root / "high_noise_model") || fs::is_directory(root / "low_noise_model")) {
    r.high = (root / "high_noise_model").string(), r.low = (root / "low_noise_model").string();
  } else {
    return std::nullopt;
  }
  for (const std::string& dir : {r.high, r.low})
    VIDIT_CHECK(fs::is_directory(dir), "two-expert release '", root_path, "': its expert folder '", dir,
                "' is missing");
  const ModelConfig high = read_transformer_config(r.high), low = read_transformer_config(r.low);
  VIDIT_CHECK(same_shape(high, low), "two-expert release '", root_path, "': the experts differ in shape (",
              r.high, ": ", shape_text(high), "; ", r.low, ": ", shape_text(low), "); both must be one DiT's shape");
  if (r.boundary_from.empty()) {  // official: Wan 2.2's own boundary for the model
    const bool i2v = high.in_channels == 2 * high.out_channels + 4;
    r.boundary = i2v ? 0.9 : 0.875;
    r.boundary_from = std::string("Wan 2.2's ") + (i2v ? "image" : "text") + "-to-video default";
  }
  r.model = high;
  r.model.boundary = r.boundary;
  return r;
}

Expert expert_of_path(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) p = p.parent_path();  // a weight file in an expert's folder
  const std::string name = p.filename().string();
  const fs::path parent = p.parent_path();
  if ((name == "transformer" || name == "transformer_2") && find_experts(parent.string()))
    return name == "transformer" ? Expert::high : Expert::low;
  if (name == "high_noise_model") return Expert::high;
  if (name == "low_noise_model") return Expert::low;
  return Expert::none;
}

std::string expert_init_path(const Config& cfg) {
  const std::string& from = cfg.train.init_from;
  const Expert want = cfg.train.expert;
  if (from.empty()) return from;
  if (const std::optional<ExpertRelease> r = find_experts(from)) {
    VIDIT_CHECK(want != Expert::none, "train.init_from '", from, "' is a two-expert release (", r->high, ", ", r->low,
                "): set train.expert = \"high\" or \"low\" (and model.boundary = ", r->boundary, ") to train one of them");
    VIDIT_CHECK(cfg.model.boundary == r->boundary, "train.init_from '", from, "' splits its experts at ", r->boundary,
                " (", r->boundary_from, ") but model.boundary = ", cfg.model.boundary, ": set model.boundary = ",
                r->boundary, " so the expert trains on the noise levels it serves");
    return want == Expert::high ? r->high : r->low;
  }
  const Expert is = expert_of_path(from);
  VIDIT_CHECK(is == Expert::none || want == Expert::none || is == want, "train.init_from '", from, "' is the ",
              name_of(is), "-noise expert, but train.expert = \"", name_of(want), "\": an expert's weights (and its "
              "LoRA) belong to that expert; point train.init_from at the ", name_of(want), "-noise expert or at the "
              "release's root");
  return from;
}

}  // namespace vidit
