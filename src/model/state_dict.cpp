#include "model/state_dict.h"

#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace vidit {

TensorMap state_dict(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& item : module.named_parameters(true)) out[item.key()] = item.value().detach();
  return out;
}

void check_state_dict(const TensorMap& expected, const TensorMap& tensors, const std::string& source) {
  std::vector<std::string> missing, unexpected, shape;
  for (const auto& [key, want] : expected) {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      missing.push_back(key);
    } else if (!it->second.sizes().equals(want.sizes())) {
      std::ostringstream os;
      os << key << " (file " << it->second.sizes() << ", model " << want.sizes() << ")";
      shape.push_back(os.str());
    }
  }
  for (const auto& [key, t] : tensors)
    if (!expected.count(key)) unexpected.push_back(key);
  if (missing.empty() && unexpected.empty() && shape.empty()) return;
  std::ostringstream os;
  os << "cannot load weights from '" << source << "':";
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    os << "\n  " << keys.size() << " " << what << ": ";
    for (size_t i = 0; i < keys.size() && i < 5; ++i) os << (i ? ", " : "") << keys[i];
    if (keys.size() > 5) os << ", ...";
  };
  list("missing key(s)", missing);
  list("unexpected key(s)", unexpected);
  list("mis-shaped key(s)", shape);
  os << "\n  the file must match the model config (dim, layers, heads, channels, patch)";
  fail(os.str());
}

void load_state_dict(torch::nn::Module& module, const TensorMap& tensors, const std::string& source) {
  TensorMap expected;
  for (const auto& item : module.named_parameters(true)) expected[item.key()] = item.value();
  check_state_dict(expected, tensors, source);
  torch::NoGradGuard ng;
  for (auto& [key, p] : expected) p.copy_(tensors.at(key));
}

TensorMap read_weights(const std::string& path) {
  namespace fs = std::filesystem;
  VIDIT_CHECK(fs::exists(path), "weights '", path, "' not found: give a .safetensors file or a folder of them");
  if (!fs::is_directory(path)) return load_safetensors(path);
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  VIDIT_CHECK(!shards.empty(), "folder '", path, "' holds no .safetensors files");
  TensorMap all;
  for (const auto& shard : shards)
    for (auto& [k, v] : load_safetensors(shard.string())) {
      VIDIT_CHECK(!all.count(k), "key '", k, "' appears in two shards of '", path, "' (second: ",
                  shard.filename().string(), ")");
      all.emplace(k, std::move(v));
    }
  return all;
}

}  // namespace vidit
