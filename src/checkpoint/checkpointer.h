// The checkpoint protocol of a training run, in one place: saves (snapshot into host buffers,
// write and verify in the background, commit, retention) and resumes (newest first, every rank
// reads and verifies into fresh memory, the ranks agree, corrupt checkpoints are fallen back
// past and set aside only once an older one has loaded, and nothing live changes until then).
// The run hands its state over and takes it back through CheckpointedRun; the files are
// checkpoint.h's, reached only through core/storage.h's Storage (the fault injection's wrapper
// included), so another store than a POSIX file system can serve.
//
// The protocol between ranks. Every rank makes these collectives over the world, at the same
// points of the run and in this order; none may be skipped on some ranks only:
//   start_save     a barrier, once rank 0 has opened the step's directory (removing what a
//                  killed save left). A synchronous save (checkpoint.async off, or no snapshot
//                  buffers) then finishes at once (below).
//   finish_oldest  (1) an all-gather of each rank's outcome of its oldest save: in flight, its
//                  failure (none / its write failed / its write did not end within
//                  checkpoint.timeout_s), bytes, seconds; when a write failed, an all-gather
//                  of the failed rank's reason (sizes, then bytes); (2) when every part was written, an
//                  all-gather of the sizes, then of the bytes, of every writer's part record
//                  (file sizes and tensor checksums) to rank 0, which commits; (3) a broadcast
//                  of the commit's result from rank 0. A rank without a save in flight takes
//                  part all the same.
//   resume         per candidate, newest first: an all-gather of each rank's outcome (verified /
//                  corrupt in which file / does not fit / unreadable / other); a barrier after
//                  the one applied, and before an error every rank throws.
// Rank 0 alone opens directories, commits, sets checkpoints aside and prints the reports.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_writer.h"

namespace vidit {

class EventLog;
class FaultInjector;
class Mesh;
class ParallelModel;

// The [checkpoint] section, as the checkpointer takes it.
struct CheckpointOptions {
  std::string out_dir;        // checkpoints go to <out_dir>/checkpoints
  int64_t keep = 2;           // newest committed checkpoints kept (and newest set aside)
  int64_t keep_every = 0;     // also every checkpoint whose step is a multiple of this
  bool async = true;          // written by a background thread
  int64_t snapshots = 2;      // sets of host buffers (0: written from the live state)
  double timeout_s = 1800;    // a rank's write that has not ended by then stops the run
  int64_t failures_max = 3;   // failed saves in a row that stop the run
};

// What came of a save, the same on every rank.
struct SaveOutcome {
  int64_t step = -1;
  bool committed = false;
  std::string dir;          // rank 0: the committed directory
  double blocked_s = 0;     // this rank's pause of training for the snapshot
  double write_s = 0;       // the slowest writer's time
  double bytes = 0;         // written by all ranks
  int writers = 0;
};

// A checkpoint read into fresh memory and checked against the run, not yet in place. The run's
// own type derives from it.
struct StagedState {
  virtual ~StagedState() = default;
  std::string dir;
  int64_t step = 0;
};

// What the checkpointer needs of the run.
class CheckpointedRun {
 public:
  virtual ~CheckpointedRun() = default;
  // The state to save now: this rank's live tensors (the checkpointer keeps the keys this rank
  // writes and copies them), the step and what else meta.json records. Collective where the
  // run needs it to be (e.g. gathering the ranks' random streams): every rank calls it.
  virtual CheckpointState checkpoint_state() = 0;
  // This rank's share of `ckpt` in fresh memory, checked against the run: throws vidit::Error
  // when it does not fit, CheckpointCorrupt / CheckpointUnreadable as the reader does. Nothing
  // live changes. This rank alone.
  virtual std::unique_ptr<StagedState> stage(const CheckpointReader& ckpt) const = 0;
  // Puts a staged state in place of the live one.
  virtual void apply(std::unique_ptr<StagedState> staged) = 0;
};

class Checkpointer {
 public:
  // `hosts`: every rank's host (named in messages); `events`: the run's event log (rank 0
  // writes). Allocates nothing yet (reserve() does).
  Checkpointer(CheckpointOptions opt, std::shared_ptr<const Mesh> mesh, const ParallelModel& model,
               std::vector<std::string> hosts, FaultInjector& faults, std::function<EventLog&()> events);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Allocates and touches the snapshot buffers for the state `run` holds now (collective as
  // checkpoint_state() is); returns their bytes (0 on a rank that writes no part).
  int64_t reserve(CheckpointedRun& run);
  int64_t snapshot_bytes() const { return snapshot_bytes_; }
  // Waits for the oldest save in flight when starting another would exceed the buffers
  // (collective, as finish_oldest()). The next start_save's reported pause counts from here.
  void make_room();
  // Snapshots the state and leaves the writing to the background (or writes and commits it now
  // when synchronous). Collective.
  void start_save(CheckpointedRun& run);
  // The oldest save in flight on any rank, agreed on and committed (see the header); nullopt
  // when no rank had one. Collective. Throws when checkpoint.failures_max saves in a row failed
  // or a write did not end within checkpoint.timeout_s (on every rank alike).
  std::optional<SaveOutcome> finish_oldest();
  // Every save in flight. Returns, on rank 0, the directory of the last save finished since the
  // previous call (a synchronous save finishes in start_save) when it committed; "" otherwise.
  std::string finish_all();
  int in_flight() const { return writer_.in_flight() + (sync_report_ ? 1 : 0); }
  // This rank's writer is still writing (not collective: fit() agrees on it with the others).
  bool writing() const { return writer_.in_flight() > 0 && !writer_.finished(); }
  double seconds_since_save() const;

  // Resumes from the newest checkpoint every rank verifies (see the header); false when there
  // is none. Collective.
  bool resume(CheckpointedRun& run);
  // Reads, verifies and applies one checkpoint directory on this rank alone.
  void load(const std::string& dir, CheckpointedRun& run);

  // Rank 0, after each committed save: its report (the run's sinks: saves.jsonl, the console
  // line, TensorBoard scalars; train/metric_sinks.h).
  std::function<void(const SaveOutcome&)> on_committed;

 private:
  struct Pending {  // what the commit needs of a save in flight (no tensors)
    CheckpointState meta;
    Storage* storage = nullptr;
  };
  struct Snapshots {
    TensorMap model, ema, optimizer;
  };
  bool lead() const;
  bool writes_part() const;
  TensorMap written_part(const TensorMap& m) const;
  [[noreturn]] void agreed_unreadable(CheckpointUnreadable e) const;
  CheckpointOptions opt_;
  std::shared_ptr<const Mesh> mesh_;
  const ParallelModel& model_;
  std::vector<std::string> hosts_;
  FaultInjector& faults_;
  std::function<EventLog&()> events_;
  CheckpointWriter writer_;
  std::deque<Pending> pending_;  // the saves in flight, oldest first
  std::optional<SaveReport> sync_report_;
  Snapshots snaps_[2];
  int snap_slot_ = 0;
  int64_t snapshot_bytes_ = 0;
  int64_t failed_saves_ = 0;
  std::string last_dir_;  // of the last save finished (committed), for finish_all()
  std::chrono::steady_clock::time_point last_save_time_;
  std::optional<std::chrono::steady_clock::time_point> room_from_;  // make_room() began: the pause
};

}  // namespace vidit
