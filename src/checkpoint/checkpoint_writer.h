// Asynchronous checkpoint saves. The trainer pauses only to copy its state into host buffers
// (pinned when the state is on a GPU; kept and reused from one save to the next); a background
// thread on each rank then writes that rank's part (checkpoint.h: write_checkpoint_part),
// fsyncs and verifies it while training goes on, and keeps the part's record. Nothing here uses
// the ranks' communicator, so a write never counts against a collective's timeout: the
// Checkpointer (checkpointer.h) gathers the records and commits once every rank's writer is done.
// A save that comes while the previous one is still being written snapshots into a second set
// of host buffers and is written right after it (double buffering), so training does not wait
// for the previous write unless a third comes. A state that is not finite is never saved: the
// verification of each file (checkpoint.h) fails the part, so the save, when a tensor is not.
// Each file is verified on a second thread while the next one is written, so the disk writes
// without pause.
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

#include "checkpoint/checkpoint.h"

namespace vidit {

class Storage;

// What one rank does in one save.
struct SaveJob {
  std::string out_dir;
  CheckpointState state;  // this rank's part, in host buffers nobody changes until the save ends
  bool write = false;     // this rank writes a part
  int rank = 0;           // named in messages
  bool with_ema = false;
  Storage* storage = nullptr;
};

// What came of it on this rank.
struct SaveReport {
  int64_t step = -1;
  PartRecord part;      // what this rank wrote (index -1: no part)
  std::string error;    // empty: this rank's share succeeded
  bool timed_out = false;  // the write had not ended within wait()'s timeout
  double blocked_s = 0;  // training paused for the snapshot (and the wait for the previous save)
  double write_s = 0;    // the background thread's time: write and verify
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
  // Waits for the oldest save in flight, if any, and returns what came of it. With `timeout_s`
  // > 0, a write that has not ended by then is reported as this rank's failure; the writer
  // takes no more saves then (the run stops: checkpointer.h), and its destructor still waits
  // for the write (a storage that never returns is the watchdog's to end).
  std::optional<SaveReport> wait(double timeout_s = 0);
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
  bool abandoned_ = false;
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
