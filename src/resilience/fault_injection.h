// Fault injection, part of the product and off by default ([faults] in the config): a real job
// is made to fail the way clusters fail, so that every recovery mechanism is shown working by a
// run of the real binary under a real launcher (src/resilience/fault_recovery_test.cpp).
//  - exit, kill, sigterm: after step `faults.step`, rank `faults.rank` exits (status 17), sends
//                 itself SIGKILL (no handler, no flush: a node that dies) or SIGTERM (what a
//                 scheduler sends to preempt; stop_signal.h);
//  - corrupt_checkpoint, truncate_checkpoint: after the checkpoint of step `faults.step` is
//                 committed, rank 0 overwrites 4 KiB in the middle of its first model part with
//                 garbage, or truncates that file to half its size (bit rot, a torn copy).
// Each fault fires once per process and says on stderr what it did.
#pragma once
#include <cstdint>
#include <string>

#include "core/config.h"

namespace vidit {

class FaultInjector {
 public:
  FaultInjector(const FaultConfig& cfg, int rank) : cfg_(cfg), rank_(rank) {}
  // After step `step` completed on this rank.
  void after_step(int64_t step);
  // After the checkpoint of `step` was committed in `dir` (rank 0's view; "" on other ranks).
  void after_save(int64_t step, const std::string& dir);

 private:
  FaultConfig cfg_;
  int rank_;
  bool fired_ = false;
};

}  // namespace vidit
