// The watchdog: a thread that ends this process when it stops making progress. A rank that
// hangs (a deadlocked collective, a stuck file system, a GPU that stopped answering) would
// otherwise hold the whole job forever: MPI has no timeout, and the ranks it blocks look alive
// to every launcher. The trainer beats at every step, every tensor it loads and every save;
// when no beat comes for `timeout_s`, the watchdog names the rank, host, pid, the phase and the
// last step on stderr and exits with kStallStatus, so the launcher ends the other ranks and a
// restart resumes from the last checkpoint. Ranks that wait on the hung one stop beating too and
// end themselves the same way, so the job ends within about `timeout_s` even without a
// launcher that notices.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace vidit {

// The exit status of a process the watchdog ended.
inline constexpr int kStallStatus = 86;

class Watchdog {
 public:
  // timeout_s <= 0: off (no thread).
  Watchdog(double timeout_s, int rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Progress. `phase` (a string literal) is named if the next beat does not come.
  void beat(const char* phase, int64_t step = -1);

 private:
  void watch();
  const double timeout_s_;
  const int rank_;
  std::atomic<int64_t> last_ns_;
  std::atomic<const char*> phase_{"starting"};
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace vidit
