// One live run per output directory, and an output directory that can take a checkpoint.
//
// RunLock holds <out_dir>/vidit.lock (JSON: host, pid, start time) while the run is alive; a
// thread refreshes its time every few seconds. A second run on the same out_dir (a requeued job
// that starts while the old one still runs, a colleague's typo) would interleave checkpoints
// and metrics with the first, so it is refused with a message naming the holder. A lock left by
// a run that died is taken over: on the same host when its pid is gone (waited for up to 8 s:
// a restart may start while the old processes are still being ended), from any host once its
// time has not been refreshed for `stale_s`. A lock of another host that looks fresh is watched
// for up to `stale_s`: refreshed in that time means alive (refused), not refreshed means dead.
//
// A pid alone does not name a process: pids are reused, and in a container, where the run is
// often pid 1 or close to it, a restart's pid is usually the dead run's. So the lock also records
// which process holds that pid: its start time in clock ticks since boot ("proc_start", field 22
// of /proc/<pid>/stat), the kernel's boot id ("boot_id") and the pid namespace ("pid_ns"). A
// same-host holder is alive only while a process with its pid exists and started at the recorded
// tick; a live pid with another start time is a reused pid, and the lock is taken over. A lock
// from another boot or pid namespace (a reboot, or a second machine or container that shares the
// host name) names a pid that means nothing here, so it is judged like another host's, by age.
//
// check_out_dir: before training starts, out_dir must be writable and have room for at least
// one more checkpoint, so that a full or read-only disk is found now, not at the first save.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace vidit {

class RunLock {
 public:
  // Takes the lock or throws vidit::Error naming the holder and what to do.
  explicit RunLock(const std::string& out_dir, double stale_s = 60);
  ~RunLock();  // releases it (removes the file if it is still ours)
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  const std::string& path() const { return path_; }
  // Said when a stale lock was taken over, and why the holder counts as gone ("" otherwise).
  const std::string& took_over() const { return took_over_; }

 private:
  void refresh_loop();
  std::string path_, content_, took_over_;
  double stale_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Throws vidit::Error when `out_dir` cannot be created or written, or has less than `need_bytes`
// free (the message gives both numbers and what to do).
void check_out_dir(const std::string& out_dir, uint64_t need_bytes);

// This machine's name.
std::string host_name();

}  // namespace vidit
