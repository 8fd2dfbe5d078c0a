// The watchdog: a thread that ends this process when it stops making progress. A rank that
// hangs (a deadlocked collective, a stuck file system, a GPU that stopped answering) would
// otherwise hold the whole job forever: MPI has no timeout, and the ranks it blocks look alive
// to every launcher. The trainer beats at every step, every tensor it loads and every save;
// when no beat comes for `timeout_s`, the watchdog names the rank, host, pid, the phase and the
// last step on stderr and exits with kStallStatus, so the launcher ends the other ranks and a
// restart resumes from the last checkpoint. Ranks that wait on the hung one stop beating too and
// end themselves the same way, so the job ends within about `timeout_s` even without a
// launcher that notices.
//
// Hangs are found sooner than `timeout_s` once steps have a known length: in the training phases
// (not while loading, saving or evaluating) the limit is `stall_steps` x the median step time
// (expect_step_s), but at least `min_s`; so a job whose steps take 2 s ends a hang in minutes,
// well before a collective timeout. And each rank's watchdog writes a heartbeat file every
// second (report_to: <dir>/rank_NNNNN.json with its host, pid, phase, step and the number of
// collectives it has entered, from the watchdog's own thread, so a rank whose main thread is
// stuck still reports; also at once when a wait in a collective has lasted kBlockedBeatS, with
// how long it has (`blocked_s`): when a rank dies and the launcher kills the others a moment
// later, the survivors' last heartbeats then show that they were waiting, in a collective the
// dead one never entered, after its last heartbeat; also a stop signal it received, at once, and how the process ended:
// "exited" from the destructor, "watchdog"; a rank killed or crashed leaves neither, which is
// how a restart finds it, diagnose/crashes.h). When a watchdog fires it reads every rank's
// heartbeat and names the ranks that did not arrive: those that entered fewer collectives than
// the others (every rank of the job enters the same sequence), with their host, pid, phase and
// step, or says that all entered the same number (they wait on each other, or on the network or file system). Before it
// ends the process, it has the main thread write its own stack (a signal handler) to
// <dir>/rank_NNNNN.stack and prints its first frames: where the rank is stuck (in which
// collective, which file operation).
#pragma once
#include <pthread.h>

#include <functional>
#include <string>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace vidit {

// The exit status of a process the watchdog ended.
inline constexpr int kStallStatus = 86;
// A wait in a collective this long gets a heartbeat of its own (once per wait).
inline constexpr double kBlockedBeatS = 0.2;

class Watchdog {
 public:
  // timeout_s <= 0: off (no thread). stall_steps <= 0: no step-based limit.
  Watchdog(double timeout_s, int rank, double stall_steps = 0, double min_s = 60);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Progress. `phase` (a string literal) is named if the next beat does not come.
  // `adaptive`: the step-based limit applies to this phase (not to loading, saving, evaluating).
  void beat(const char* phase, int64_t step = -1, bool adaptive = true);
  // The median step time so far (0: not known yet; the step-based limit waits for it).
  void expect_step_s(double s) { step_s_.store(s); }
  // Heartbeats of `world` ranks in `dir`; `issued`: collectives this rank entered (any thread);
  // `blocked`: how long the collective it waits in now has lasted (s, 0: none); `on_stall`: told
  // the report before the process ends (rank 0 records it in events.jsonl).
  void report_to(const std::string& dir, int world, std::function<int64_t()> issued,
                 std::function<double()> blocked = {}, std::function<void(const std::string&)> on_stall = {});
  // The limit in force now, in seconds.
  double limit_s() const;

 private:
  void watch();
  void write_heartbeat();
  std::string who_did_not_arrive() const;
  // Has the main thread (the one that made the watchdog) write its stack to
  // <dir>/rank_NNNNN.stack; returns its first frames for the report ("" when none).
  std::string dump_main_stack();
  const double timeout_s_, stall_steps_, min_s_;
  const int rank_;
  std::atomic<double> step_s_{0};
  std::atomic<bool> adaptive_{false};
  std::string dir_;
  int world_ = 0;
  std::function<int64_t()> issued_;
  std::function<double()> blocked_;
  int64_t blocked_beat_ = -1;  // the collective count of the last wait a heartbeat was written for
  std::function<void(const std::string&)> on_stall_;
  std::atomic<int64_t> last_ns_;
  std::atomic<const char*> phase_{"starting"};
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  pthread_t main_;
  const char* ended_ = "";  // how the process ended, for its last heartbeat ("exited", "watchdog")
  std::thread thread_;
};

}  // namespace vidit
