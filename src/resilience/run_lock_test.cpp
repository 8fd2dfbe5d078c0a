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
#include <thread>

#include "../../tests/test_util.h"
#include "core/error.h"

namespace vidit {
namespace {

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
