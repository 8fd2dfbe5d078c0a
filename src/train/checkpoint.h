// Training checkpoints. One directory per save:
//   <out_dir>/checkpoints/step_00000100/{model,ema,optimizer}.safetensors + meta.json
// meta.json holds the step, the resolved config, the data sampler position and the EMA count;
// optimizer.safetensors also holds the RNG state ("rng/train"). A save is atomic: files are
// written (fsync'd) into step_N.tmp/, the directory is renamed, and only then is the
// <out_dir>/checkpoints/latest pointer replaced, so a crash at any point leaves the previous
// checkpoint intact and `latest` valid. Older checkpoints beyond `keep` are removed last.
//
// Sharded (FSDP): each shard's writer puts its part in {model,ema,optimizer}.shard-0000k-of-0000S
// .safetensors (1-D chunks of the flattened, padded parameters, named as the parameters), and
// meta.json's "shards" records S and every parameter's shape. load_checkpoint() reassembles
// whole tensors from the parts, so a sharded checkpoint loads at any mesh (and in one process).
// Tensor parallel: each member of the tensor group writes its parts (FSDP-sharded as above when
// there is FSDP too) to {model,ema,optimizer}.tp-0000t-of-0000T.shard-0000k-of-0000S.safetensors;
// "shards" then records the shapes of the parts, and meta.json's "tensor" records T and the
// dimension each split parameter was cut along. They are put back together on load too.
// The three steps of a distributed save: rank 0 begin_checkpoint(), a barrier, every writer
// write_checkpoint_shard(), a barrier, rank 0 commit_checkpoint().
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "core/safetensors.h"
#include "data/epoch_sampler.h"

namespace vidit {

struct CheckpointState {
  int64_t step = 0;
  // Sharded: the number of parts and each parameter's whole shape (empty: whole tensors).
  int64_t shards = 0;
  std::map<std::string, std::vector<int64_t>> shapes;
  // Tensor parallel: the number of parts (0: none) and, per split parameter, its split dim.
  int64_t tensor = 0;
  std::map<std::string, int> split;
  TensorMap model, ema, optimizer;  // optimizer also carries "rng/train"
  SamplerState sampler;
  int64_t ema_updates = 0;
  std::string config_toml;
};

// Saves and returns the checkpoint directory (whole tensors, one process).
std::string save_checkpoint(const std::string& out_dir, const CheckpointState& state, int64_t keep);
// The distributed save, in three steps (see above). begin returns the temporary directory.
std::string begin_checkpoint(const std::string& out_dir, int64_t step);
std::string checkpoint_tmp_dir(const std::string& out_dir, int64_t step);  // what begin returns
void write_checkpoint_shard(const std::string& tmp_dir, const CheckpointState& part, int64_t index,
                            int64_t tensor_index = 0);
std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& state, int64_t keep);
// Directory named by <out_dir>/checkpoints/latest, if any.
std::optional<std::string> latest_checkpoint(const std::string& out_dir);
// Loads a checkpoint directory whole; throws vidit::Error naming the file on anything missing or bad.
CheckpointState load_checkpoint(const std::string& dir);

// Reads a checkpoint one whole tensor at a time from its memory-mapped files: a rank resuming
// at any mesh cuts each tensor to its own part and drops it (Trainer::load), so it never holds
// more than one whole tensor beyond its own state, and reads from disk only what it touches.
// load_checkpoint() reads everything through it.
class CheckpointReader {
 public:
  // Reads meta.json and maps every file; throws naming the first one missing or malformed.
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  // Everything but the tensors (step, sampler, EMA count, config, part layout).
  const CheckpointState& meta() const { return meta_; }
  bool has(const std::string& what) const;  // "model", "ema" (absent when saved without), "optimizer"
  std::vector<std::string> keys(const std::string& what) const;
  // The whole tensor under `key` (an owned copy), put together from its parts.
  at::Tensor whole(const std::string& what, const std::string& key) const;
  // Every key's whole shape and dtype, as tensors on the meta device (for checks before reading).
  TensorMap shapes(const std::string& what) const;

 private:
  struct Part;
  const std::vector<Part>& parts(const std::string& what) const;
  std::string param_of(const std::string& key) const;
  std::string dir_;
  CheckpointState meta_;
  std::map<std::string, std::vector<Part>> parts_;
};

}  // namespace vidit
