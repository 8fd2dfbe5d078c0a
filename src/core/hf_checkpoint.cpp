#include "core/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace vidit {
namespace fs = std::filesystem;

HfWeightFiles find_hf_weight_files(const std::string& path, const std::string& component, const std::string& what,
                                   bool allow_pth) {
  std::error_code ec;
  HfWeightFiles w;
  VIDIT_CHECK(fs::exists(path, ec), what, ": '", path, "' does not exist: pass a ", component,
              " folder (config.json + model.safetensors), a diffusers pipeline folder, or a .safetensors",
              allow_pth ? " / .pth" : "", " file");
  if (fs::is_regular_file(path, ec)) {
    w.files = {path};
    const fs::path cfg = fs::path(path).parent_path() / "config.json";
    if (fs::is_regular_file(cfg, ec)) w.config = cfg.string();
    return w;
  }
  fs::path dir(path);
  const bool has_own = fs::exists(dir / "config.json", ec) || fs::exists(dir / "model.safetensors", ec) ||
                       fs::exists(dir / "model.safetensors.index.json", ec);
  if (!has_own && fs::is_directory(dir / component, ec)) dir /= component;
  if (fs::is_regular_file(dir / "config.json", ec)) w.config = (dir / "config.json").string();
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    w.index = index.string();
    nlohmann::json j;
    try {
      std::ifstream in(index);
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      fail(what, ": cannot parse the shard index '", index.string(), "': ", e.what());
    }
    VIDIT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), what, ": '", index.string(),
                "' has no weight_map object; is it a Hugging Face sharded-checkpoint index?");
    std::set<std::string> shards;
    for (const auto& [key, file] : j["weight_map"].items()) {
      VIDIT_CHECK(file.is_string(), what, ": '", index.string(), "': weight_map[\"", key, "\"] is not a file name");
      shards.insert(file.get<std::string>());
    }
    for (const auto& s : shards) {
      const fs::path f = dir / s;
      VIDIT_CHECK(fs::is_regular_file(f, ec), what, ": shard '", f.string(), "' named by '", index.string(),
                  "' is missing; download every model-*-of-*.safetensors file");
      w.files.push_back(f.string());
    }
    return w;
  }
  if (fs::is_regular_file(dir / "model.safetensors", ec)) {
    w.files = {(dir / "model.safetensors").string()};
    return w;
  }
  // A folder holding one weight file under another name (Wan's models_t5_umt5-xxl-enc-bf16.*).
  std::vector<std::string> st, pth;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto ext = e.path().extension().string();
    if (ext == ".safetensors") st.push_back(e.path().string());
    if (allow_pth && (ext == ".pth" || ext == ".pt")) pth.push_back(e.path().string());
  }
  if (st.size() == 1) w.files = st;
  else if (st.empty() && pth.size() == 1) w.files = pth;
  else
    fail(what, ": no model.safetensors (nor model.safetensors.index.json", st.size() > 1 ? ", and more than one other "
         ".safetensors file" : "", ") in '", dir.string(), "'; pass the ", component, " folder of a Hugging Face / "
         "diffusers checkpoint or the weight file itself");
  return w;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

}  // namespace vidit
