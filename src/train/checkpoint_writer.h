// Asynchronous checkpoint saves. The trainer pauses only to copy its state into host buffers
// (pinned when the state is on a GPU; kept and reused from one save to the next); a background
// thread on each rank then writes that rank's part (checkpoint.h: write_checkpoint_part) and
// fsyncs it while training goes on, and rank 0's thread waits, on the file system, for every
// part and commits the checkpoint. Nothing of this uses the ranks' communicator, so a save
// never counts against a collective's timeout. A save that comes while the previous one is still
// being written snapshots into a second set of host buffers and is written right after it
// (double buffering), so training does not wait for the previous write unless a third comes. A state that is not finite is never saved: the
// verification of each file (checkpoint.h) fails the part, so the save, when a tensor is not.
// Each file is verified on a second thread while the next one is written, so the disk writes
// without pause. One save is in flight at a time: the next one
// (and the end of the run) first waits for it, and all ranks then agree, with one collective,
// on whether it committed.
#pragma once
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint.h"

namespace vidit {

class Storage;

// What one rank does in one save.
struct SaveJob {
  std::string out_dir;
  CheckpointState state;  // this rank's part, in host buffers nobody changes until the save ends
  bool write = false;     // this rank writes a part
  bool commit = false;    // rank 0: wait for every part and commit
  int rank = 0;           // named in messages
  bool with_ema = false;
  int64_t keep = 2, keep_every = 0;
  double timeout_s = 1800;  // how long the commit waits for the other parts
  Storage* storage = nullptr;
};

// What came of it on this rank.
struct SaveReport {
  int64_t step = -1;
  std::string dir;     // the committed directory (rank 0)
  std::string error;   // empty: this rank's share succeeded
  bool in_commit = false;  // the error came from the commit (another part), not this rank's write
  double blocked_s = 0;  // training paused for the snapshot (and the wait for the previous save)
  double write_s = 0;    // the background thread's time: write, verify, (rank 0) wait and commit
  uint64_t bytes = 0;    // written by this rank
};

class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  ~CheckpointWriter();  // waits for the saves in flight: a checkpoint is never abandoned half-written
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Starts writing `job` in the background, after the save in flight if there is one (its
  // snapshot is in the other set of host buffers); at most two may be in flight.
  void start(SaveJob job, double blocked_s);
  // Writes `job` on the calling thread.
  static SaveReport run(const SaveJob& job);
  // Waits for the oldest save in flight, if any, and returns what came of it.
  std::optional<SaveReport> wait();
  // Saves started and not yet waited for, and their steps (oldest first).
  int in_flight() const { return int(saves_.size()); }
  std::vector<int64_t> steps() const;
  // Every save in flight is done writing (wait() would return at once).
  bool finished() const;

 private:
  struct Save {
    int64_t step = -1;
    std::thread thread;
    std::shared_ptr<SaveReport> report;
    std::shared_future<void> done;
  };
  std::deque<Save> saves_;
};

// Copies `from` into `buffers` (same keys; a buffer is made, pinned for GPU tensors, only when
// missing or of another shape) and returns the buffers of those keys: the state as it is now,
// which training may change right after.
TensorMap snapshot(const TensorMap& from, TensorMap& buffers);

// Makes the buffers snapshot() would make for `like` (same keys, shapes and dtypes; pinned when
// `like` is on a GPU) and touches every page of them now, so that a save's pause is the copy only,
// not the allocation and first-touch page faults of gigabytes (what made a run's first two saves
// pause 20-30 times longer than later ones). Returns their bytes.
int64_t reserve_snapshot(const TensorMap& like, TensorMap& buffers);

}  // namespace vidit
