// The progress of `vidit prepare`'s workers, shared through the cache directory: every worker of
// several rewrites <cache_dir>/progress/w{W}.json every few seconds (and when it ends); worker 0
// reads the others' and shows the totals after its own numbers. A file last written well before
// this worker's own first one is an earlier run's and is left out (modification times compared
// on the one file system, so the hosts' clocks need not agree). Only the display depends on
// these files: one that cannot be written is a warning, once.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/progress.h"

namespace vidit {

// "w007": the name of worker 7's files (progress/, rejects/, done/, clips/ of the cache).
std::string worker_name(int worker);

class ProgressBoard {
 public:
  static constexpr double kEverySeconds = 5;

  // Worker 0 of several shows the totals after its own numbers on each line of `p`.
  ProgressBoard(Progress& p, const std::string& cache_dir, int worker, int workers, int64_t all_entries);

  // Writes this worker's file and (worker 0) reads the others' when kEverySeconds have passed
  // since the last time, or now.
  void update(bool now = false);

 private:
  void read_others();
  // "all 4 workers: 350/3000 videos 11%, clips 300, rejected 50, 7.10 videos/s, 6m05s left":
  // this worker's numbers as they are now, the others' as last read.
  std::string totals(const ProgressSnapshot& mine) const;

  Progress& progress_;
  std::string dir_;
  int worker_, workers_;
  int64_t all_entries_;
  double last_ = -1e300;
  std::optional<std::filesystem::file_time_type> since_;
  std::vector<ProgressSnapshot> others_;  // worker 0: the others' last published numbers
  int not_heard_ = 0;                     // worker 0: others with no file from this run yet
  bool warned_ = false;
};

}  // namespace vidit
