#include "resilience/run_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace vidit {
namespace fs = std::filesystem;

std::string host_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

namespace {

// Seconds since the lock file's last refresh, or -1 when it is gone.
double age_s(const std::string& path, timespec* mtime = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  if (mtime) *mtime = st.st_mtim;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return double(now.tv_sec - st.st_mtim.tv_sec) + double(now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
}

// A process that exists and is not a zombie.
bool alive(long pid) {
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// Which process holds a pid. Field 22 of /proc/<pid>/stat is when the process started, in clock
// ticks since boot: a pid reused by a later process has a later start. -1 when unknown (no such
// process, or no /proc).
long long start_ticks(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  // Fields are split by spaces after the command name, which may itself hold spaces and ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return -1;
  try {
    return std::stoll(field);
  } catch (const std::exception&) {
    return -1;
  }
}

// A start in clock ticks since boot as a local date and time, for messages.
std::string when_started(long long ticks) {
  std::ifstream stat("/proc/stat");
  std::string key;
  long long boot = -1;  // the "btime" line: the boot time in seconds since the epoch
  while (stat >> key) {
    if (key == "btime") {
      stat >> boot;
      break;
    }
    stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (boot < 0 || hz <= 0) return std::to_string(ticks) + " clock ticks after boot";
  const std::time_t t = std::time_t(boot + ticks / hz);
  std::tm local{};
  char text[32] = {0};
  ::localtime_r(&t, &local);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// This process's pid namespace ("pid:[4026531836]"); "" when /proc does not say.
std::string pid_namespace() {
  char link[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  return n > 0 ? std::string(link, size_t(n)) : std::string();
}

// The holder with `pid` on this host and in this pid namespace is alive: its process exists, is
// not a zombie and, when its lock recorded its start (`start` >= 0), started then. A live pid
// that started at another time belongs to another process: false, and `reused` says so.
bool holder_alive(long pid, long long start, std::string* reused) {
  if (!alive(pid)) return false;
  if (start < 0) return true;  // a lock of an older vidit, without its start: the pid alone decides
  const long long now = start_ticks(pid);
  if (now < 0 || now == start) return true;  // unknown (no /proc): trust the pid, as before
  *reused = "pid " + std::to_string(pid) + " now belongs to another process, started at " + when_started(now) +
            ", not the holder, which started at " + when_started(start) + ", so the holder is gone";
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool create_exclusive(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    VIDIT_CHECK(errno == EEXIST, "cannot create the run lock '", path, "': ", std::strerror(errno),
                "; is train.out_dir writable?");
    return false;
  }
  const ssize_t w = ::write(fd, content.data(), content.size());
  ::fsync(fd);
  ::close(fd);
  VIDIT_CHECK(w == ssize_t(content.size()), "cannot write the run lock '", path, "'");
  return true;
}

}  // namespace

RunLock::RunLock(const std::string& out_dir, double stale_s) : stale_s_(stale_s) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  path_ = (fs::path(out_dir) / "vidit.lock").string();
  const std::string host = host_name();
  const long pid = long(::getpid());
  // Which process this is, so that a later run can tell it from another that reuses its pid.
  const long long my_start = start_ticks(pid);
  const std::string boot_id = first_line("/proc/sys/kernel/random/boot_id"), pid_ns = pid_namespace();
  nlohmann::json mine{{"host", host}, {"pid", pid}, {"started", long(std::time(nullptr))}};
  if (my_start >= 0) mine["proc_start"] = my_start;
  if (!boot_id.empty()) mine["boot_id"] = boot_id;
  if (!pid_ns.empty()) mine["pid_ns"] = pid_ns;
  content_ = mine.dump() + "\n";
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (create_exclusive(path_, content_)) break;
    // Someone holds it: alive, or a run that died?
    nlohmann::json holder;
    try {
      holder = nlohmann::json::parse(read_text(path_));
    } catch (const std::exception&) {
      holder = nlohmann::json::object();  // a torn lock: judged by its age alone
    }
    const std::string their_host = holder.value("host", std::string("?"));
    const long their_pid = holder.value("pid", 0L);
    const std::string who = "host " + their_host + ", pid " + std::to_string(their_pid);
    // Its pid names a process here only when the lock comes from this boot and this pid namespace.
    // A lock written by an older vidit has none of these fields: its pid alone decides, as before.
    const auto other = [&](const char* key, const std::string& ours) {
      const auto it = holder.find(key);
      return it != holder.end() && it->is_string() && !ours.empty() && it->get<std::string>() != ours;
    };
    const bool same_pids =
        their_host == host && their_pid > 0 && !other("boot_id", boot_id) && !other("pid_ns", pid_ns);
    const auto start = holder.find("proc_start");
    const long long their_start = start != holder.end() && start->is_number_integer() ? start->get<long long>() : -1;
    std::string reused;  // why a live pid is not the holder's process
    bool dead = false;
    if (same_pids) {
      // A run that is ending (its launcher has just ended the job, and a restart came at once)
      // is given a few seconds to go.
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(8.0, stale_s_));
      while (!(dead = !holder_alive(their_pid, their_start, &reused)) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      VIDIT_CHECK(dead, "another run is using ", out_dir, " (", who, ", lock ", path_,
                  "): two runs on one out_dir would mix their checkpoints. Stop it, or give this run another "
                  "train.out_dir");
    } else {
      // Another host (or another boot or pid namespace): alive when it refreshes the lock while we watch.
      timespec first{}, now{};
      double age = age_s(path_, &first);
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(stale_s_);
      while (age >= 0 && age < stale_s_ && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        age = age_s(path_, &now);
        VIDIT_CHECK(age < 0 || (now.tv_sec == first.tv_sec && now.tv_nsec == first.tv_nsec), "another run is using ",
                    out_dir, " (", who, ", lock ", path_, ", refreshed ", age,
                    " s ago): two runs on one out_dir would mix their checkpoints. Stop it, or give this run "
                    "another train.out_dir");
      }
      dead = age >= stale_s_;
      if (age < 0) continue;  // released meanwhile: try again
    }
    if (dead) {
      took_over_ = "the run lock " + path_ + " of a run that is gone (" + who + ") was taken over" +
                   (reused.empty() ? "" : ": " + reused);
      fs::remove(path_, ec);
    }
  }
  VIDIT_CHECK(read_text(path_) == content_, "could not take the run lock ", path_, ": another run took it at the same time");
  thread_ = std::thread([this] { refresh_loop(); });
}

void RunLock::refresh_loop() {
  const auto period = std::chrono::duration<double>(std::max(0.1, stale_s_ / 6));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return done_; })) ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
}

RunLock::~RunLock() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (read_text(path_) == content_) ::unlink(path_.c_str());
}

void check_out_dir(const std::string& out_dir, uint64_t need_bytes) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  VIDIT_CHECK(!ec, "cannot create train.out_dir '", out_dir, "': ", ec.message());
  const std::string probe = (fs::path(out_dir) / (".write-check." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VIDIT_CHECK(fd >= 0, "train.out_dir '", out_dir, "' is not writable: ", std::strerror(errno),
              "; fix its permissions or point train.out_dir elsewhere");
  const bool wrote = ::write(fd, "ok", 2) == 2 && ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  VIDIT_CHECK(wrote, "train.out_dir '", out_dir, "' cannot be written: ", std::strerror(write_errno));
  struct statvfs vfs {};
  VIDIT_CHECK(::statvfs(out_dir.c_str(), &vfs) == 0, "cannot read the free space of '", out_dir, "': ",
              std::strerror(errno));
  const uint64_t free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  VIDIT_CHECK(free_bytes >= need_bytes, "train.out_dir '", out_dir, "' has ", free_bytes / 1e9,
              " GB free but a checkpoint of this model takes about ", need_bytes / 1e9,
              " GB: free space, lower checkpoint.keep, or point train.out_dir elsewhere");
}

}  // namespace vidit
