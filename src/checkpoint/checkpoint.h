// Training checkpoints. One directory per save:
//   <out_dir>/checkpoints/step_00000100/{model,ema,optimizer}.safetensors + manifest.json + meta.json
// meta.json holds the step, the resolved config, the data sampler position and the EMA count;
// optimizer.safetensors also holds the RNG state ("rng/train").
//
// Trust: every writer writes its files (fsync'd) into step_N.tmp/, reads each back and checks
// every tensor against a checksum (xxHash3-64) of what it meant to write, and records the
// files' sizes and checksums (PartRecord), which reach the committing rank through the ranks'
// collectives (checkpoint/checkpointer.h), never by watching the directory. The commit checks
// that every part is there at the recorded size, writes manifest.json (all of them) and meta.json (last: a directory with
// meta.json is committed), renames the directory into place (a step saved again replaces the old
// one only once the new one is complete), and only then updates the `latest` pointer. A crash at
// any point leaves every committed checkpoint intact; stale .tmp directories are removed by the
// next save, and a step_N.old left by a crash between the commit's two renames (step N saved
// again) is put back by the next scan when step_N itself is gone. Loading verifies each tensor
// it reads against the manifest and names the file and tensor that fail.
//
// What a failed load means: only proof of damage is corruption (CheckpointCorrupt: a size or
// checksum mismatch, a file or part missing, our own format's files malformed, a manifest missing
// where the format always writes one). A checkpoint that cannot be read now or by this binary
// (CheckpointUnreadable: an I/O or permission error, no memory to map it, a newer format) is not
// damaged, and nothing is done to it. Trainer::resume falls back past corrupt checkpoints and sets
// them aside as step_N.corrupt only once an older one has loaded (see there). Retention keeps the
// newest `keep` committed checkpoints and every `keep_every`-th step, and the newest `keep`
// checkpoints set aside.
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
// write_checkpoint_part(), its record to rank 0, rank 0 commit_checkpoint().
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "core/storage.h"
#include "loader/epoch_sampler.h"
#include "parallel/layout.h"

namespace vidit {

// The format this binary writes ("vidit-checkpoint-2" in meta.json) and the newest it reads.
inline constexpr int kCheckpointFormat = 2;

// A checkpoint proven damaged: a file missing, truncated, or not matching its checksum, or one of
// our files malformed. `file()` names the file it was found in (ranks agree on it before a
// checkpoint is set aside). Any other failure of a load is not this.
class CheckpointCorrupt : public Error {
 public:
  CheckpointCorrupt(const std::string& what, std::string file) : Error(what), file_(std::move(file)) {}
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// A checkpoint that could not be read, which proves nothing about its bytes: an I/O error, a
// permission error, no memory to map it (code(): the system's errno), a format newer than this
// binary reads, or a first-format checkpoint without a manifest to verify it by (code() 0). A
// run that meets one stops with kUnreadableCheckpointStatus and leaves the checkpoint as it is.
class CheckpointUnreadable : public Error {
 public:
  CheckpointUnreadable(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }
  // Every rank has printed the message already (the ranks agreed on it, and waited for one
  // another to print before any ends the job): whoever catches it need not print it again.
  bool reported = false;

 private:
  int code_;
};
inline constexpr int kUnreadableCheckpointStatus = 74;  // sysexits' EX_IOERR

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
// What a writer recorded of its part: each file's size and its tensors' checksums (of the bytes
// read back), as the commit and the manifest take them. It travels from every writer to the
// committing rank as text.
struct FileRecord {
  uint64_t bytes = 0;
  std::map<std::string, std::string> tensors;  // key -> xxHash3-64, 16 hex digits
};
struct PartRecord {
  int64_t index = -1;  // the part's number; -1: no part (a rank that writes none)
  std::map<std::string, FileRecord> files;
  uint64_t bytes() const;
  std::string to_json() const;
  static PartRecord from_json(const std::string& text);  // throws vidit::Error when malformed
};
// Writes state.model, optimizer and (with_ema) ema as part state.part.index, each file fsynced,
// then read back and compared byte for byte (and checked finite) while the next is written; a
// part may hold no tensor of a kind and is written all the same. Returns the part's record;
// throws when a file fails to write or verify, or the state is not finite.
PartRecord write_checkpoint_part(const std::string& tmp_dir, const CheckpointState& part, bool with_ema,
                                 Storage& storage);
// Commits the save of `state.step` from every part's record (one per part index; records of
// index -1 are skipped): checks each recorded file is in the directory at its recorded size,
// writes manifest.json and meta.json, renames the directory into place, points `latest` at it,
// applies retention. Throws vidit::Error naming the part or file that is missing; nothing is
// committed then.
std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& state,
                              const std::vector<PartRecord>& parts, int64_t keep, int64_t keep_every,
                              Storage& storage);
// Every committed checkpoint under <out_dir>/checkpoints, newest first (a missing or stale
// `latest` pointer changes nothing), and the newest, if any. A committed step_N.old whose step_N
// is gone (a crash between the commit's two renames) is renamed back to step_N first.
std::vector<std::string> checkpoint_candidates(const std::string& out_dir, Storage& storage = local_storage());
std::optional<std::string> latest_checkpoint(const std::string& out_dir, Storage& storage = local_storage());
// What <out_dir>/checkpoints holds besides committed checkpoints that shows a run saved there:
// checkpoints set aside (.corrupt), a step_N.old; empty when nothing.
std::vector<std::string> traces_of_checkpoints(const std::string& out_dir, Storage& storage = local_storage());
// Renames a checkpoint proven corrupt to <dir>.corrupt (<dir>.corrupt.2, ... when that name is
// taken: an older one is never replaced), kept for inspection and no longer a candidate; keeps
// the newest `keep` set aside (older ones are removed); points `latest` at `now_latest` (the
// checkpoint resumed from instead). Returns the new name.
std::string set_aside_checkpoint(const std::string& dir, const std::string& now_latest = "", int64_t keep = 0,
                                 Storage& storage = local_storage());
// Records a manifest (sizes and checksums) for a first-format checkpoint saved without one, from
// its files as they are now: the user vouches for them. Returns the number of tensors.
int64_t seal_checkpoint(const std::string& dir, Storage& storage = local_storage());
// Loads a checkpoint directory whole; throws vidit::Error naming the file on anything missing or bad.
CheckpointState load_checkpoint(const std::string& dir);

// Reads a checkpoint one whole tensor at a time from its memory-mapped files: a rank resuming
// at any mesh cuts each tensor to its own part and drops it (Trainer::load), so it never holds
// more than one whole tensor beyond its own state, and reads from disk only what it touches.
// load_checkpoint() reads everything through it.
class CheckpointReader {
 public:
  // Reads meta.json and the manifest and maps every file, through `storage`; throws
  // CheckpointCorrupt naming the first one missing, malformed or not of its recorded size, and
  // CheckpointUnreadable when the system fails a read or the format is newer.
  explicit CheckpointReader(const std::string& dir, Storage& storage = local_storage());
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
  void open(Storage& storage);
  at::Tensor assemble(const std::string& what, const std::string& key, std::string* file_read) const;
  const std::vector<Part>& parts(const std::string& what) const;
  std::string dir_;
  CheckpointState meta_;
  std::map<std::string, std::vector<Part>> parts_;
  // From manifest.json: file -> tensor -> checksum.
  std::map<std::string, std::map<std::string, std::string>> sums_;
  std::map<std::string, uintmax_t> sizes_;  // file -> bytes
};

}  // namespace vidit
