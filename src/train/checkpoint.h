// Training checkpoints. One directory per save:
//   <out_dir>/checkpoints/step_00000100/{model,ema,optimizer}.safetensors + manifest.json + meta.json
// meta.json holds the step, the resolved config, the data sampler position and the EMA count;
// optimizer.safetensors also holds the RNG state ("rng/train").
//
// Trust: every writer writes its files (fsync'd) into step_N.tmp/, reads each back and checks
// every tensor against a checksum (xxHash3-64) of what it meant to write, then records the
// files' sizes and checksums in sums.part-*.json. The commit checks that every part is there at
// the recorded size, writes manifest.json (all of them) and meta.json (last: a directory with
// meta.json is committed), renames the directory into place (a step saved again replaces the old
// one only once the new one is complete), and only then updates the `latest` pointer. A crash at
// any point leaves every committed checkpoint intact; stale .tmp directories are removed by the
// next save. Loading verifies each tensor it reads against the manifest and names the file and
// tensor that fail; Trainer::resume then falls back to the next newest checkpoint, setting the
// bad one aside as step_N.corrupt. Retention keeps the newest `keep` committed checkpoints and
// every `keep_every`-th step.
//
// Distributed: the tensors are saved as the ranks hold them, in parts described by layouts
// (parallel/layout.h) and written by one rank each (CheckpointPart there):
// {model,ema,optimizer}.part-0000i-of-0000n.safetensors, numbered row-major over the mesh
// dimensions some parameter is cut over. Part i holds, for every parameter, the piece at its
// coordinates on the dimensions that parameter is cut over, if its coordinates on the others are
// 0 (so each piece is written once), and part 0 also every key that names no parameter (step
// counts, RNG states). meta.json records each parameter's layout and the parts' dimensions;
// the reader puts each tensor back together from them, so a checkpoint loads at any mesh and in
// one process, and nothing in this file knows a parallelism. One part: plain
// {model,ema,optimizer}.safetensors, readable by any safetensors tool.
//
// Checkpoints of the first format ("vidit-checkpoint-1": FSDP shards
// *.shard-0000k-of-0000S and tensor-parallel parts *.tp-0000t-of-0000T.shard-...) load too: their
// meta is read as layouts of the same kind.
// The three steps of a save: rank 0 begin_checkpoint(), a barrier, every writer
// write_checkpoint_part(), a barrier, rank 0 commit_checkpoint().
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "loader/epoch_sampler.h"
#include "parallel/layout.h"

namespace vidit {

class Storage;

// A checkpoint whose files do not verify: missing, truncated, corrupted or malformed (every
// failure of CheckpointReader). Trainer::resume sets such a checkpoint aside and falls back to
// an older one; any other failure of a load (a config that does not match) is not this.
class CheckpointCorrupt : public Error {
 public:
  using Error::Error;
};

struct CheckpointState {
  int64_t step = 0;
  // How the tensors are cut (empty: every tensor whole), and which part this state is.
  Layouts layouts;
  CheckpointPart part;
  TensorMap model, ema, optimizer;  // optimizer also carries "rng/train"
  SamplerState sampler;
  int64_t ema_updates = 0;
  std::string config_toml;
};

// Saves a state of one part and returns the checkpoint directory.
std::string save_checkpoint(const std::string& out_dir, const CheckpointState& state, int64_t keep);
// The save in three steps (see above), through `storage` (core/storage.h). begin returns the
// temporary directory.
// `writing`: the steps of saves still being written, whose directories are not stale.
std::string begin_checkpoint(const std::string& out_dir, int64_t step, Storage& storage,
                             const std::vector<int64_t>& writing = {});
std::string checkpoint_tmp_dir(const std::string& out_dir, int64_t step);  // what begin returns
// Writes state.model, optimizer and (with_ema) ema as part state.part.index, each file fsynced,
// then read back and compared byte for byte (and checked finite) while the next is written; a
// part may hold no tensor of a kind and is written all the same. Returns the bytes written;
// throws when a file fails to write or verify, or the state is not finite.
uint64_t write_checkpoint_part(const std::string& tmp_dir, const CheckpointState& part, bool with_ema,
                               Storage& storage);
// A writer whose part failed says so (best effort), so that the commit stops waiting for it.
void fail_checkpoint_part(const std::string& tmp_dir, const CheckpointPart& part, const std::string& why,
                          Storage& storage);
// Waits up to `wait_s` for every part (written by other ranks' writers, asynchronously), checks
// them and commits; throws vidit::Error naming the part that failed or never came.
std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& state, int64_t keep,
                              int64_t keep_every, Storage& storage, double wait_s);
// Every committed checkpoint under <out_dir>/checkpoints, newest first (a missing or stale
// `latest` pointer changes nothing), and the newest, if any.
std::vector<std::string> checkpoint_candidates(const std::string& out_dir);
std::optional<std::string> latest_checkpoint(const std::string& out_dir);
// Renames a checkpoint that failed verification to <dir>.corrupt (kept for inspection, no longer
// a candidate or counted by retention); returns the new name.
std::string set_aside_checkpoint(const std::string& dir);
// Loads a checkpoint directory whole; throws vidit::Error naming the file on anything missing or bad.
CheckpointState load_checkpoint(const std::string& dir);

// Reads a checkpoint one whole tensor at a time from its memory-mapped files: a rank resuming
// at any mesh cuts each tensor to its own part and drops it (Trainer::load), so it never holds
// more than one whole tensor beyond its own state, and reads from disk only what it touches.
// load_checkpoint() reads everything through it.
class CheckpointReader {
 public:
  // Reads meta.json and the manifest and maps every file; throws CheckpointCorrupt naming the
  // first one missing, malformed or not of its recorded size.
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  // Everything but the tensors (step, sampler, EMA count, config, layouts).
  const CheckpointState& meta() const { return meta_; }
  bool has(const std::string& what) const;  // "model", "ema" (absent when saved without), "optimizer"
  std::vector<std::string> keys(const std::string& what) const;
  // The whole tensor under `key` (an owned copy), put together from its parts, each verified
  // against the manifest's checksum; throws CheckpointCorrupt naming the file and tensor.
  at::Tensor whole(const std::string& what, const std::string& key) const;
  // Every key's whole shape and dtype, as tensors on the meta device (for checks before reading).
  TensorMap shapes(const std::string& what) const;

 private:
  struct Part;
  void open();
  at::Tensor assemble(const std::string& what, const std::string& key) const;
  const std::vector<Part>& parts(const std::string& what) const;
  std::string dir_;
  CheckpointState meta_;
  std::map<std::string, std::vector<Part>> parts_;
  // From manifest.json (checkpoints before it have none): file -> tensor -> checksum.
  std::map<std::string, std::map<std::string, std::string>> sums_;
};

}  // namespace vidit
