#include "model/state_dict.h"

#include "core/unallocated.h"

#include <sstream>

#include "core/error.h"
#include "model/weight_layout.h"

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
  for (auto& [key, p] : expected) {
    allocate(p);  // a model built without storage gets its memory one tensor at a time
    p.copy_(tensors.at(key));
  }
}

TensorMap read_weights(const std::string& path) { return read_transformer_weights(path); }

}  // namespace vidit
