#include "resilience/watchdog.h"

#include "resilience/run_lock.h"  // host_name
#include "resilience/stop_signal.h"

#include <cxxabi.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace vidit {

namespace {
// The main thread's stack, written by itself: the watchdog signals it (kStackSignal) and its
// handler writes the raw frames to the file descriptor given, with backtrace_symbols_fd (no
// allocation). The watchdog thread then demangles them.
const int kStackSignal = SIGRTMIN + 2;
std::atomic<int> g_stack_fd{-1};
std::atomic<bool> g_stack_done{false};

void write_own_stack(int) {
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  const int fd = g_stack_fd.load();
  if (fd >= 0) ::backtrace_symbols_fd(frames, n, fd);
  g_stack_done.store(true);
}

// "binary(mangled+0x1f) [0x...]" -> "demangled (binary)".
std::string readable_frame(const std::string& line) {
  const size_t open = line.find('('), plus = line.find('+', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return line;
  const std::string mangled = line.substr(open + 1, plus - open - 1);
  int status = 0;
  char* name = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : mangled;
  std::free(name);
  if (const size_t args = out.find('('); args != std::string::npos && args > 0) out.resize(args);  // the name alone
  return out + "  (" + std::filesystem::path(line.substr(0, open)).filename().string() + ")";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(double timeout_s, int rank, double stall_steps, double min_s)
    : timeout_s_(timeout_s), stall_steps_(stall_steps), min_s_(min_s), rank_(rank), last_ns_(now_ns()),
      main_(::pthread_self()) {
  if (timeout_s_ <= 0) return;
  // backtrace() loads its unwinder on first use: done here, not inside a signal handler.
  void* frame[1];
  ::backtrace(frame, 1);
  struct sigaction sa {};
  sa.sa_handler = write_own_stack;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(kStackSignal, &sa, nullptr);
  thread_ = std::thread([this] { watch(); });
}

std::string Watchdog::dump_main_stack() {  // with mu_ held
  if (dir_.empty()) return "";
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.stack", rank_);
  const std::string path = dir_ + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return "";
  g_stack_done.store(false);
  g_stack_fd.store(fd);
  ::pthread_kill(main_, kStackSignal);
  for (int i = 0; i < 100 && !g_stack_done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  g_stack_fd.store(-1);
  ::close(fd);
  // The file again, readable: the frames below the handler and the signal trampoline (the first
  // two), demangled.
  std::ifstream in(path);
  std::vector<std::string> frames;
  int skip = 2;
  for (std::string line; std::getline(in, line);)
    if (skip-- <= 0) frames.push_back(readable_frame(line));
  in.close();
  std::ofstream out(path, std::ios::trunc);
  std::string first;
  for (size_t i = 0; i < frames.size(); ++i) {
    out << "#" << i << " " << frames[i] << "\n";
    if (i < 12) first += "\n    #" + std::to_string(i) + " " + frames[i];
  }
  return frames.empty() ? "" : "its main thread's stack (" + path + "):" + first;
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The process ends by its own hand (a return, an error): said in its last heartbeat, so that a
  // restart can tell it from a rank that was killed or crashed (diagnose/crashes.h).
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = "exited";
  write_heartbeat();
}

void Watchdog::beat(const char* phase, int64_t step, bool adaptive) {
  phase_.store(phase);
  adaptive_.store(adaptive);
  if (step >= 0) step_.store(step);
  last_ns_.store(now_ns());
}

void Watchdog::report_to(const std::string& dir, int world, std::function<int64_t()> issued,
                         std::function<double()> blocked, std::function<void(const std::string&)> on_stall) {
  std::lock_guard<std::mutex> lock(mu_);
  std::filesystem::create_directories(dir);
  dir_ = dir, world_ = world, issued_ = std::move(issued), blocked_ = std::move(blocked),
  on_stall_ = std::move(on_stall);
  // A first heartbeat at once (a rank that dies in its first second still leaves one), and the
  // file a stop signal's handler writes.
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.signal", rank_);
  std::error_code ec;
  std::filesystem::remove(dir_ + "/" + name, ec);
  set_signal_marker(dir_ + "/" + name);
  write_heartbeat();
}

double Watchdog::limit_s() const {
  const double step = step_s_.load();
  if (stall_steps_ <= 0 || step <= 0 || !adaptive_.load()) return timeout_s_;
  return std::min(timeout_s_, std::max(min_s_, stall_steps_ * step));
}

namespace {
std::string heartbeat_path(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.json", rank);
  return dir + "/" + name;
}
}  // namespace

void Watchdog::write_heartbeat() {  // with mu_ held
  if (dir_.empty()) return;
  const nlohmann::json j = {{"rank", rank_},
                            {"host", host_name()},
                            {"pid", int(::getpid())},
                            {"phase", phase_.load()},
                            {"step", step_.load()},
                            {"collectives", issued_ ? issued_() : -1},
                            {"blocked_s", blocked_ ? blocked_() : 0.0},
                            {"idle_s", double(now_ns() - last_ns_.load()) / 1e9},
                            {"time", long(std::time(nullptr))},
                            {"time_ms", int64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count())},
                            {"signal", stop_signal()},
                            {"ended", ended_}};
  const std::string path = heartbeat_path(dir_, rank_), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    if (!out) return;  // a full disk must not end the run from here
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

std::string Watchdog::who_did_not_arrive() const {  // with mu_ held
  if (dir_.empty()) return "";
  std::vector<nlohmann::json> beats;
  int64_t most = -1;
  std::ostringstream missing;
  for (int r = 0; r < world_; ++r) {
    std::ifstream in(heartbeat_path(dir_, r));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) {
      missing << (missing.tellp() > 0 ? ", " : "") << r;
      continue;
    }
    most = std::max<int64_t>(most, j.value("collectives", int64_t(-1)));
    beats.push_back(std::move(j));
  }
  std::ostringstream out;
  int behind = 0;
  for (const auto& j : beats) {
    if (j.value("collectives", int64_t(-1)) >= most) continue;
    out << (behind++ ? "; " : "") << "rank " << j.value("rank", -1) << " (" << j.value("host", "") << ", pid "
        << j.value("pid", 0) << ") entered " << j.value("collectives", int64_t(0)) << " collectives against " << most
        << ", last while " << j.value("phase", "") << " after step " << j.value("step", int64_t(0)) << ", idle "
        << int64_t(j.value("idle_s", 0.0)) << " s at its last heartbeat " << std::max<long>(0, long(std::time(nullptr)) - j.value("time", 0L))
        << " s ago";
  }
  std::string report;
  if (behind > 0) report = "ranks that did not arrive: " + out.str();
  else if (!beats.empty()) report = "every rank that reports entered the same " + std::to_string(most) +
                                    " collectives: they wait on each other, or on the network or file system";
  if (missing.tellp() > 0) report += (report.empty() ? "" : "; ") + std::string("no heartbeat from rank(s) ") + missing.str();
  return report;
}

void Watchdog::watch() {
  // Every 0.1 s: a stop signal is written to the heartbeat at once (a launcher that ends the job
  // sends SIGTERM, then SIGKILL soon after); the heartbeat and the check every period.
  const double period = std::min(1.0, timeout_s_ / 4);
  std::unique_lock<std::mutex> lock(mu_);
  int signal_seen = 0;
  auto next = std::chrono::steady_clock::now();
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; })) {
    if (stop_signal() != signal_seen) {
      signal_seen = stop_signal();
      write_heartbeat();
    }
    if (blocked_ && issued_ && blocked_() >= kBlockedBeatS && issued_() != blocked_beat_) {
      blocked_beat_ = issued_();
      write_heartbeat();
    }
    if (std::chrono::steady_clock::now() < next) continue;
    next = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double>(period));
    write_heartbeat();
    const double idle = double(now_ns() - last_ns_.load()) / 1e9, limit = limit_s();
    if (idle < limit) continue;
    // The others' heartbeats are at most a second old: wait for one more round of them.
    cv_.wait_for(lock, std::chrono::milliseconds(1500), [this] { return done_; });
    if (done_) return;
    const std::string stack = dump_main_stack();
    const std::string others = who_did_not_arrive();
    std::fprintf(stderr,
                 "watchdog: rank %d on %s (pid %d) made no progress for %.0f s (limit %.0f s) while %s (after step "
                 "%lld)%s%s; ending this process (exit %d) so that the launcher ends the job and a restart resumes "
                 "from the last checkpoint. Raise train.stall_timeout_s / train.stall_steps if steps or saves really "
                 "take this long\n",
                 rank_, host_name().c_str(), int(::getpid()), idle, limit, phase_.load(), (long long)step_.load(),
                 others.empty() ? "" : "; ", others.c_str(), kStallStatus);
    if (!stack.empty()) std::fprintf(stderr, "watchdog: rank %d: %s\n", rank_, stack.c_str());
    std::fflush(nullptr);
    if (on_stall_) on_stall_(others);
    ended_ = "watchdog";
    write_heartbeat();
    std::_Exit(kStallStatus);
  }
}

}  // namespace vidit
