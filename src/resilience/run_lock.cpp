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
  content_ = nlohmann::json{{"host", host}, {"pid", pid}, {"started", long(std::time(nullptr))}}.dump() + "\n";
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
    bool dead = false;
    if (their_host == host && their_pid > 0) {
      // A run that is ending (its launcher has just ended the job, and a restart came at once)
      // is given a few seconds to go.
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(8.0, stale_s_));
      while (!(dead = !alive(their_pid)) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      VIDIT_CHECK(dead, "another run is using ", out_dir, " (", who, ", lock ", path_,
                  "): two runs on one out_dir would mix their checkpoints. Stop it, or give this run another "
                  "train.out_dir");
    } else {
      // Another host: alive when it refreshes the lock while we watch.
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
      took_over_ = "the run lock " + path_ + " of a run that is gone (" + who + ") was taken over";
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
              " GB: free space, lower train.keep_checkpoints, or point train.out_dir elsewhere");
}

}  // namespace vidit
