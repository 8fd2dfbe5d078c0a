// Median timing for the benchmarks that compare vidit with a Python reference: the median
// wall-clock and process CPU milliseconds (all threads) of a call over `reps` runs after one
// warm-up run. CPU time is the figure that other processes on a shared machine disturb less.
#pragma once
#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <vector>

namespace vidit::bench {

inline double cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

struct Timing {
  double wall_ms, cpu_ms;
};

inline Timing median_ms(int reps, const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    const double c = cpu_ms();
    f();
    cpu.push_back(cpu_ms() - c);
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace vidit::bench
