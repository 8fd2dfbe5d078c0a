// Training checkpoints. One directory per save:
//   <out_dir>/checkpoints/step_00000100/{model,ema,optimizer}.safetensors + meta.json
// meta.json holds the step, the resolved config, the data sampler position and the EMA count;
// optimizer.safetensors also holds the RNG state ("rng/train"). A save is atomic: files are
// written (fsync'd) into step_N.tmp/, the directory is renamed, and only then is the
// <out_dir>/checkpoints/latest pointer replaced, so a crash at any point leaves the previous
// checkpoint intact and `latest` valid. Older checkpoints beyond `keep` are removed last.
#pragma once
#include <optional>
#include <string>

#include "core/safetensors.h"
#include "data/epoch_sampler.h"

namespace vidit {

struct CheckpointState {
  int64_t step = 0;
  TensorMap model, ema, optimizer;  // optimizer also carries "rng/train"
  SamplerState sampler;
  int64_t ema_updates = 0;
  std::string config_toml;
};

// Saves and returns the checkpoint directory.
std::string save_checkpoint(const std::string& out_dir, const CheckpointState& state, int64_t keep);
// Directory named by <out_dir>/checkpoints/latest, if any.
std::optional<std::string> latest_checkpoint(const std::string& out_dir);
// Loads a checkpoint directory; throws vidit::Error naming the file on anything missing or bad.
CheckpointState load_checkpoint(const std::string& dir);

}  // namespace vidit
