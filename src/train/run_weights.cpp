#include "train/run_weights.h"

#include <filesystem>

#include "core/error.h"
#include "model/dit.h"
#include "model/lora.h"
#include "model/state_dict.h"
#include "train/checkpoint.h"

namespace vidit {

namespace fs = std::filesystem;

bool is_vidit_checkpoint_path(const std::string& path) {
  return fs::is_directory(fs::path(path) / "checkpoints") || fs::exists(fs::path(path) / "meta.json");
}

CheckpointWeights read_checkpoint_weights(const std::string& from, bool use_ema) {
  CheckpointWeights w;
  w.checkpoint = from;
  if (fs::is_directory(fs::path(from) / "checkpoints")) {
    auto latest = latest_checkpoint(from);
    VIDIT_CHECK(latest, "'", from, "' is a run folder with no committed checkpoint under checkpoints/");
    w.checkpoint = *latest;
  }
  VIDIT_CHECK(fs::exists(fs::path(w.checkpoint) / "meta.json"), "'", from,
              "' is neither a run folder (with checkpoints/) nor a checkpoint (with meta.json)");
  CheckpointState s = load_checkpoint(w.checkpoint);
  w.step = s.step;
  w.config = parse_config(s.config_toml, w.checkpoint + "/meta.json");
  w.ema = use_ema && !s.ema.empty();
  TensorMap saved = w.ema ? std::move(s.ema) : std::move(s.model);
  if (!holds_lora(saved)) {
    w.weights = std::move(saved);
    return w;
  }
  VIDIT_CHECK(w.config.lora.rank > 0, w.checkpoint, " holds LoRA adapters but its config has lora.rank = 0");
  w.adapters = std::move(saved);
  w.lora_scale = lora_scale(w.config.lora);
  const std::string& base = w.config.train.init_from;
  TensorMap base_weights;
  if (base.empty()) {
    // The trainer's own random init for the run's seed (train/trainer.cpp builds it the same way).
    torch::manual_seed(w.config.train.seed);
    DiT model(w.config.model);
    model->init_weights();
    base_weights = state_dict(*model);
  } else {
    VIDIT_CHECK(fs::exists(base), w.checkpoint, " is a LoRA run on the base weights '", base,
                "' (its train.init_from), which are no longer there: put them back, or edit train.init_from in ",
                w.checkpoint, "/meta.json's config to where they are now");
    base_weights = read_any_weights(base);
  }
  w.weights = merge_lora(base_weights, w.adapters, w.lora_scale);
  return w;
}

TensorMap read_any_weights(const std::string& path) {
  if (is_vidit_checkpoint_path(path)) return read_checkpoint_weights(path).weights;
  return read_weights(path);
}

}  // namespace vidit
