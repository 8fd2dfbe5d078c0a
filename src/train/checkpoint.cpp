#include "train/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace vidit {
namespace fs = std::filesystem;

std::string save_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep) {
  fs::path root = fs::path(out_dir) / "checkpoints";
  fs::create_directories(root);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(s.step));
  fs::path final_dir = root / name, tmp = root / (std::string(name) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_safetensors((tmp / "model.safetensors").string(), s.model);
  if (!s.ema.empty()) save_safetensors((tmp / "ema.safetensors").string(), s.ema);
  save_safetensors((tmp / "optimizer.safetensors").string(), s.optimizer);
  nlohmann::json meta = {{"format", "vidit-checkpoint-1"},
                         {"step", s.step},
                         {"ema_updates", s.ema_updates},
                         {"sampler", {{"seed", s.sampler.seed}, {"epoch", s.sampler.epoch},
                                      {"position", s.sampler.position}}},
                         {"config", s.config_toml}};
  write_file_atomic((tmp / "meta.json").string(), meta.dump(2));
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_file_atomic((root / "latest").string(), std::string(name) + "\n");

  // Prune the oldest complete checkpoints beyond `keep` (never the one just written).
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos)
      all.push_back(e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != final_dir) fs::remove_all(all[i]);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir) {
  fs::path pointer = fs::path(out_dir) / "checkpoints" / "latest";
  std::ifstream in(pointer);
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  fs::path dir = pointer.parent_path() / name;
  VIDIT_CHECK(!name.empty() && fs::is_directory(dir), "'", pointer.string(), "' points to '", name,
              "' which does not exist: remove the pointer or restore the directory");
  return dir.string();
}

CheckpointState load_checkpoint(const std::string& dir) {
  fs::path d(dir);
  CheckpointState s;
  std::ifstream in(d / "meta.json");
  VIDIT_CHECK(in, "checkpoint '", dir, "' has no meta.json: it is incomplete or not a checkpoint");
  nlohmann::json meta;
  try {
    in >> meta;
    s.step = meta.at("step").get<int64_t>();
    s.ema_updates = meta.at("ema_updates").get<int64_t>();
    s.sampler.seed = meta.at("sampler").at("seed").get<uint64_t>();
    s.sampler.epoch = meta.at("sampler").at("epoch").get<int64_t>();
    s.sampler.position = meta.at("sampler").at("position").get<int64_t>();
    s.config_toml = meta.at("config").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '", (d / "meta.json").string(), "' is malformed: ", e.what());
  }
  s.model = load_safetensors((d / "model.safetensors").string());
  if (fs::exists(d / "ema.safetensors")) s.ema = load_safetensors((d / "ema.safetensors").string());
  s.optimizer = load_safetensors((d / "optimizer.safetensors").string());
  return s;
}

}  // namespace vidit
