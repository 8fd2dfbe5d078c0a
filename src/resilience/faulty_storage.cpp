#include "resilience/faulty_storage.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace vidit {

namespace {

class FaultyFile : public WritableFile {
 public:
  FaultyFile(std::unique_ptr<WritableFile> base, FaultKind kind, bool first)
      : base_(std::move(base)), kind_(kind), first_(first) {}
  void append(const void* data, size_t n) override {
    // The length and the header are the file's first two appends: the fault comes with the
    // tensors' bytes, so that part of the file is already on disk.
    if (first_ && ++appends_ == 3) {
      if (kind_ == FaultKind::disk_full) {
        base_->append(data, n / 2);
        std::fprintf(stderr, "fault injection: the disk is full (ENOSPC) while writing %s\n", path().c_str());
        fail("write to '", path(), "' failed: ", std::strerror(ENOSPC),
             " (the disk is full: free space or point train.out_dir elsewhere)");
      }
      if (kind_ == FaultKind::kill_in_save) {
        base_->append(data, n / 2);
        std::fprintf(stderr, "fault injection: rank kills itself (SIGKILL) while writing %s\n", path().c_str());
        std::fflush(stderr);
        ::kill(::getpid(), SIGKILL);
      }
    }
    base_->append(data, n);
  }
  void sync() override {
    if (first_ && kind_ == FaultKind::io_error) {
      std::fprintf(stderr, "fault injection: fsync of %s fails (EIO)\n", path().c_str());
      fail("fsync of '", path(), "' failed: ", std::strerror(EIO));
    }
    base_->sync();
  }
  void close() override { base_->close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<WritableFile> base_;
  FaultKind kind_;
  bool first_;
  int appends_ = 0;
};

}  // namespace

std::unique_ptr<WritableFile> FaultyStorage::create(const std::string& path) {
  const bool first = files_.fetch_add(1) == 0;
  if (kind_ == FaultKind::slow_storage) {
    if (first) std::fprintf(stderr, "fault injection: storage is slow (%.1f s more per file)\n", seconds_);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
  }
  return std::make_unique<FaultyFile>(ForwardingStorage::create(path), kind_, first);
}

void FaultyStorage::rename(const std::string& from, const std::string& to) {
  ForwardingStorage::rename(from, to);
  const std::string name = to.substr(to.find_last_of('/') + 1);
  if (kind_ != FaultKind::crash_in_commit || name.rfind("step_", 0) != 0 || renames_.fetch_add(1) != 0) return;
  std::fprintf(stderr, "fault injection: rank kills itself (SIGKILL) in the commit, after renaming %s to %s\n",
               from.c_str(), to.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

std::unique_ptr<MappedFile> FaultyStorage::map(const std::string& path, const std::string& what) {
  const int err = kind_ == FaultKind::load_io_error ? EIO : kind_ == FaultKind::load_permission ? EACCES
                : kind_ == FaultKind::load_no_memory ? ENOMEM : 0;
  if (err == 0 || maps_.fetch_add(1) != 0) return ForwardingStorage::map(path, what);
  std::fprintf(stderr, "fault injection: mapping %s for reading fails (%s)\n", path.c_str(),
               err == EIO ? "EIO" : err == EACCES ? "EACCES" : "ENOMEM");
  fail_system(err, what, " '", path, "' cannot be ", err == ENOMEM ? "mapped: " : "opened: ", std::strerror(err));
}

}  // namespace vidit
