// Fault injection, part of the product and off by default ([faults] in the config): a real job
// is made to fail the way clusters fail, so that every recovery mechanism is shown working by a
// run of the real binary under a real launcher (src/train/fault_recovery_test.cpp,
// tests/faults/run_matrix.sh). On rank `faults.rank`:
//  - after step `faults.step`: exit (status 17), kill (SIGKILL: no handler, no flush: a node
//    that dies), sigterm (a scheduler's preemption; stop_signal.h), hang (stops making
//    progress: the watchdog, watchdog.h, ends it), bitflip (one bit of one weight flips: silent data
//    corruption);
//  - slow: from step `faults.step` on, its forward pass takes `faults.seconds` longer: a slow
//    device, which the others wait for (a straggler, diagnose/stragglers.h);
//  - nan_grad: in step `faults.step`, the gradient of its prediction, and so every gradient it
//    computes, becomes NaN in backward (what an overflow does); the gradient reductions carry
//    the NaN to every rank, and every rank skips that update (train_step.cpp);
//  - poison_sample: in step `faults.step`, its first sample's latents are multiplied by 1000
//    (a sample with extreme values that passed every check: the spike detector blames it);
//  - glitch: in step `faults.step`, its first sample's prediction is multiplied by 100, once (a
//    transient error of the device: re-running the step does not reproduce it);
//    (these four are injected by wrappers of what the step calls, train/step_faults.h)
//  - poison_cache: not in training but when the cache is prepared (a wrapper of the frame
//    encoder, prepare/frame_encoder.h): the sample whose cache key or source file name is
//    `faults.sample` is written with its latents x 1000 and a valid checksum, in every attempt
//    (the data itself is bad);
//  - while it writes its part of the checkpoint of step `faults.step`: disk_full, io_error,
//    slow_storage, kill_in_save (faulty_storage.h);
//  - corrupt_checkpoint, truncate_checkpoint: after that checkpoint is committed, rank 0
//    overwrites 4 KiB in the middle of its first model part with garbage, or truncates that
//    file to half its size (bit rot, a torn copy);
//  - crash_in_commit: rank 0 dies (SIGKILL) inside the commit of that checkpoint, right after
//    its first rename of the directory (faulty_storage.h);
//  - load_io_error, load_permission, load_no_memory: while it reads the checkpoint of step
//    `faults.step` (0: whichever it reads first) at a resume, the first file it maps fails with
//    EIO, EACCES or ENOMEM (use faults.attempt >= 1: the first attempt has nothing to resume).
// A process fault waits for a save in flight to be committed (process_fault_after).
// Each fault fires once per process (slow: from then on) and says on stderr what it did, and
// only in attempt `faults.attempt` of the job (0: the first), counted by the launcher
// (TORCHELASTIC_RESTART_COUNT of torchrun, SLURM_RESTART_COUNT of a requeued Slurm job), so that
// a job restarted with the same command meets the fault once, as a real one would.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/config.h"
#include "core/safetensors.h"
#include "core/storage.h"

namespace vidit {

// Which attempt of the job this is: 0 first, then the launcher's restart count
// (TORCHELASTIC_RESTART_COUNT of torchrun, SLURM_RESTART_COUNT of a requeued Slurm job).
int64_t launcher_attempt();

class FaultInjector {
 public:
  FaultInjector(const FaultConfig& cfg, int rank);
  // After step `step` completed on this rank; `params` are the weights this rank holds.
  void after_step(int64_t step, const TensorMap& params);
  // True on every rank when a process fault (exit, kill, sigterm, hang) fires on some rank
  // after step `step`: the trainer first lets the save in flight commit, so that which
  // checkpoint is on disk when the process dies is known (a death during a save is
  // kill_in_save's case). The same on all ranks, as every rank reads the same config.
  bool process_fault_after(int64_t step) const;
  // In step `step`: true when this rank's gradients are to be made NaN (the reductions carry
  // them to every rank).
  bool nan_gradient(int64_t step);
  // In step `step`: true when this rank's first sample is to be poisoned (its latents x 1000).
  bool poison_sample(int64_t step);
  // In step `step`: true when this rank's first prediction is to be corrupted (x 100), once.
  bool glitch(int64_t step);
  // slow on this rank: the seconds it adds (vidit health adds them to its timed matmul); else 0.
  double slowdown_s() const { return on_ && cfg_.kind == FaultKind::slow && rank_ == int(cfg_.rank) ? cfg_.seconds : 0; }
  // In step `step` and every later one, during the forward pass: a slow device's compute.
  void slow_compute(int64_t step);
  // The storage the save of `step` writes through: `base`, or a failing wrapper over it.
  Storage& storage_for_save(int64_t step, Storage& base);
  // The storage a resume reads the checkpoint of `step` through: `base`, or a failing wrapper.
  Storage& storage_for_load(int64_t step, Storage& base);
  // After the checkpoint of `step` was committed in `dir` (rank 0's view; "" on other ranks).
  void after_save(int64_t step, const std::string& dir);

 private:
  bool mine(int64_t step) const { return on_ && !fired_ && step == cfg_.step && rank_ == int(cfg_.rank); }
  // A fault of `kind` in step `step` on this rank: fires once, saying on stderr what it does.
  bool fire_in_step(FaultKind kind, int64_t step, const char* what);
  bool on_ = false;  // this is the attempt the faults are for
  FaultConfig cfg_;
  int rank_;
  bool fired_ = false;
  std::unique_ptr<Storage> storage_;  // the failing storage, once made
};

}  // namespace vidit
