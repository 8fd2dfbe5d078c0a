#include "diagnose/stragglers.h"

#include <algorithm>

namespace vidit {

std::vector<StragglerChange> StragglerDetector::observe(const std::vector<double>& busy_s) {
  const size_t n = busy_s.size();
  if (best_.size() != n) {
    best_.assign(n, 0);
    below_.assign(n, 0);
    straggling_.assign(n, false);
  }
  std::vector<double> sorted = busy_s;
  std::sort(sorted.begin(), sorted.end());
  // The lower median: with two ranks, the faster one is the reference.
  median_ = n ? sorted[(n - 1) / 2] : 0;
  scores_.assign(n, RankScore{});
  std::vector<StragglerChange> changes;
  for (size_t r = 0; r < n; ++r) {
    const double b = std::max(busy_s[r], 1e-9);
    if (best_[r] <= 0 || b < best_[r]) best_[r] = b;
    RankScore& s = scores_[r];
    s.rank = int(r), s.busy_s = busy_s[r];
    s.relative = std::min(1.0, median_ / b);
    s.individual = std::min(1.0, best_[r] / b);
    below_[r] = s.relative < threshold_ && busy_s[r] - median_ >= min_excess_s_ ? below_[r] + 1 : 0;
    const bool now = below_[r] >= patience_ || (straggling_[r] && below_[r] > 0);
    if (now != straggling_[r]) changes.push_back({int(r), now, s, median_, below_[r]});
    straggling_[r] = now;
  }
  return changes;
}

}  // namespace vidit
