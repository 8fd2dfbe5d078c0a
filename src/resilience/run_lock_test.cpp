// The run lock and the out_dir check, with real processes holding locks.
#include "resilience/run_lock.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "../../tests/test_util.h"
#include "core/error.h"

namespace vidit {
namespace {

// A lock as an older vidit wrote it: no start of its process, so judged by its pid alone.
void write_lock(const std::string& dir, const std::string& host, long pid) {
  std::ofstream(dir + "/vidit.lock") << "{\"host\":\"" << host << "\",\"pid\":" << pid << ",\"started\":0}\n";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunLock, HeldWhileAliveAndReleased) {
  test::ScratchDir dir("lock_held");
  {
    RunLock lock(dir.path());
    EXPECT_TRUE(std::filesystem::exists(dir / "vidit.lock"));
    EXPECT_TRUE(lock.took_over().empty());
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "vidit.lock"));
}

TEST(RunLock, LiveHolderOnThisHostIsRefusedByName) {
  test::ScratchDir dir("lock_live");
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  write_lock(dir.path(), host_name(), child);
  const std::string why = error_of([&] { RunLock lock(dir.path(), 1); });
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_NE(why.find("another run is using"), std::string::npos) << why;
  EXPECT_NE(why.find("pid " + std::to_string(child)), std::string::npos) << why;
  EXPECT_NE(why.find("host " + host_name()), std::string::npos) << why;
}

TEST(RunLock, DeadHolderOnThisHostIsTakenOver) {
  test::ScratchDir dir("lock_dead");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // gone
  write_lock(dir.path(), host_name(), child);
  RunLock lock(dir.path());
  EXPECT_NE(lock.took_over().find("pid " + std::to_string(child)), std::string::npos) << lock.took_over();
}

// The lock this process writes, with which process it is (its start, boot id, pid namespace).
nlohmann::json own_lock_record(const test::ScratchDir& dir) {
  RunLock mine(dir.path());
  return nlohmann::json::parse(std::ifstream(dir / "vidit.lock"));
}

// A restarted container's run often gets the dead run's pid. A lock naming a live pid whose
// process started at another time than the lock says is taken over at once, and says why.
TEST(RunLock, ReusedPidOnThisHostIsTakenOver) {
  test::ScratchDir dir("lock_reused");
  nlohmann::json record = own_lock_record(dir);
  ASSERT_TRUE(record.contains("proc_start") && record.contains("boot_id") && record.contains("pid_ns")) << record;
  // This test's own pid, alive, but as if written by an earlier process that had it.
  const long long start = record["proc_start"].get<long long>();
  record["proc_start"] = start > 1000 ? start - 1000 : start + 1000;
  std::ofstream(dir / "vidit.lock") << record.dump() << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  RunLock lock(dir.path());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4);  // not waited for
  const std::string pid = std::to_string(::getpid());
  EXPECT_NE(lock.took_over().find("pid " + pid + " now belongs to another process, started at "), std::string::npos)
      << lock.took_over();
  EXPECT_NE(lock.took_over().find("so the holder is gone"), std::string::npos) << lock.took_over();
}

// A live holder whose lock records its real start (it was written by RunLock in that process) is
// refused, start time and all.
TEST(RunLock, LiveHolderWithItsStartIsRefused) {
  test::ScratchDir dir("lock_live_start");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    try {
      RunLock lock(dir.path());
      const char ok = 1;
      if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
      ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ready[1]);
  char ok = 0;
  const bool held = ::read(ready[0], &ok, 1) == 1;
  ::close(ready[0]);
  nlohmann::json record;
  std::string why;
  if (held) {
    record = nlohmann::json::parse(std::ifstream(dir / "vidit.lock"));
    why = error_of([&] { RunLock lock(dir.path(), 1); });
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(held) << "the child could not take the lock";
  EXPECT_EQ(record.value("pid", 0L), long(child)) << record;
  EXPECT_TRUE(record.contains("proc_start")) << record;
  EXPECT_NE(why.find("another run is using"), std::string::npos) << why;
  EXPECT_NE(why.find("pid " + std::to_string(child)), std::string::npos) << why;
}

// A lock from another pid namespace (another container sharing the host name) names a pid that
// means nothing here, even a live one: it is judged by age, like another host's.
TEST(RunLock, OtherPidNamespacesLockIsJudgedByAge) {
  test::ScratchDir dir("lock_other_ns");
  nlohmann::json record = own_lock_record(dir);
  record["pid_ns"] = "pid:[1]";
  std::ofstream(dir / "vidit.lock") << record.dump() << "\n";  // this live pid, not refreshed
  RunLock lock(dir.path(), 1);
  EXPECT_NE(lock.took_over().find("pid " + std::to_string(::getpid())), std::string::npos) << lock.took_over();
}

TEST(RunLock, OtherHostsLockIsTakenOverOnlyWhenStale) {
  test::ScratchDir dir("lock_other_host");
  // Not refreshed for longer than stale_s: its run is gone.
  write_lock(dir.path(), "some-other-node", 12345);
  const std::string lock_file = dir / "vidit.lock";
  timespec old[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, lock_file.c_str(), old, 0), 0);
  {
    RunLock lock(dir.path(), 2);
    EXPECT_NE(lock.took_over().find("some-other-node"), std::string::npos);
  }
  // Refreshed while we watch (a live run elsewhere): refused.
  write_lock(dir.path(), "some-other-node", 12345);
  std::atomic<bool> stop{false};
  std::thread refresher([&] {
    while (!stop) {
      ::utimensat(AT_FDCWD, lock_file.c_str(), nullptr, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const std::string why = error_of([&] { RunLock lock(dir.path(), 2); });
  stop = true;
  refresher.join();
  EXPECT_NE(why.find("another run is using"), std::string::npos) << why;
  EXPECT_NE(why.find("some-other-node"), std::string::npos) << why;
}

TEST(CheckOutDir, FullOrUnwritableDirectoryIsFoundBeforeTraining) {
  test::ScratchDir dir("out_dir_check");
  EXPECT_NO_THROW(check_out_dir(dir / "run", 1000));
  const std::string full = error_of([&] { check_out_dir(dir / "run", uint64_t(1) << 62); });
  EXPECT_NE(full.find("GB free but a checkpoint of this model takes"), std::string::npos) << full;
  EXPECT_NE(full.find(dir / "run"), std::string::npos) << full;
  // A path under a regular file cannot be created.
  std::ofstream(dir / "file") << "x";
  const std::string bad = error_of([&] { check_out_dir(dir / "file/run", 1000); });
  EXPECT_NE(bad.find("cannot create train.out_dir"), std::string::npos) << bad;
}

}  // namespace
}  // namespace vidit
