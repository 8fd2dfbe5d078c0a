// Straggler detection. A rank that computes slowly (a throttled GPU, a bad DIMM, a noisy
// neighbour) makes every other rank wait for it at each collective, so the whole job runs at
// its speed. Each logged step every rank's busy time (its step time minus the time it was
// blocked in collectives: where the work runs) is gathered, and each rank gets two scores in
// (0, 1], as NVIDIA's NVRx straggler detection scores them:
//  - relative: the median busy time over ranks / this rank's (0.5: twice as slow as the
//    typical rank);
//  - individual: this rank's own best busy time so far / its current one (a rank that got
//    slower than it was, even if all did).
// A rank whose relative score stays below `threshold` for `patience` logged steps in a row is
// a straggler: reported once when it becomes one (rank, host, scores) and once when it
// recovers, in events.jsonl and on the console.
//
// The busy time is host time on the CPU; on a GPU it must come from CUDA events around the
// step's kernels (the host only queues them), which is left to the GPU work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vidit {

struct RankScore {
  int rank = 0;
  double busy_s = 0, relative = 1, individual = 1;
};

struct StragglerChange {
  int rank = 0;
  bool straggling = false;  // true: it became a straggler; false: it recovered
  RankScore score;
  double median_busy_s = 0;
  int64_t steps = 0;        // logged steps in a row below the threshold (when it became one)
};

class StragglerDetector {
 public:
  // `min_excess_s`: a rank is below the threshold only if it is also this much slower than the
  // median, so that the jitter of very short steps (a shared machine, tiny tests) is no straggler.
  StragglerDetector(double threshold = 0.7, int64_t patience = 3, double min_excess_s = 0.05)
      : threshold_(threshold), patience_(patience), min_excess_s_(min_excess_s) {}
  // One logged step's busy time per rank; returns the ranks whose state changed.
  std::vector<StragglerChange> observe(const std::vector<double>& busy_s);
  // The scores of the last observe(), by rank.
  const std::vector<RankScore>& scores() const { return scores_; }
  double median_busy_s() const { return median_; }
  bool straggling(int rank) const { return size_t(rank) < straggling_.size() && straggling_[size_t(rank)]; }
  // Logged steps in a row the rank has been below the threshold.
  int64_t below(int rank) const { return size_t(rank) < below_.size() ? below_[size_t(rank)] : 0; }

 private:
  double threshold_;
  int64_t patience_;
  double min_excess_s_;
  std::vector<RankScore> scores_;
  std::vector<double> best_;
  std::vector<int64_t> below_;
  std::vector<bool> straggling_;
  double median_ = 0;
};

}  // namespace vidit
