#include "resilience/watchdog.h"

#include "resilience/run_lock.h"  // host_name

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace vidit {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(double timeout_s, int rank) : timeout_s_(timeout_s), rank_(rank), last_ns_(now_ns()) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(const char* phase, int64_t step) {
  phase_.store(phase);
  if (step >= 0) step_.store(step);
  last_ns_.store(now_ns());
}

void Watchdog::watch() {
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 4));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return done_; })) {
    const double idle = double(now_ns() - last_ns_.load()) / 1e9;
    if (idle < timeout_s_) continue;
    std::fprintf(stderr,
                 "watchdog: rank %d on %s (pid %d) made no progress for %.0f s while %s (after step %lld); "
                 "ending this process (exit %d) so that the launcher ends the job and a restart resumes from the "
                 "last checkpoint. Raise train.stall_timeout_s if steps or saves really take this long\n",
                 rank_, host_name().c_str(), int(::getpid()), idle, phase_.load(), (long long)step_.load(), kStallStatus);
    std::fflush(nullptr);
    std::_Exit(kStallStatus);
  }
}

}  // namespace vidit
