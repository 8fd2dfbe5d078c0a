// Storage that fails the way disks fail (fault injection, resilience/fault_injection.h): a
// ForwardingStorage (core/storage.h) over the real one that, for the files created through it,
//  - disk_full:    fails a write in the middle of the first file with ENOSPC;
//  - io_error:     fails the first fsync with EIO (what a dying disk or a lost NFS server does);
//  - slow_storage: takes `seconds` longer for every file (a congested parallel file system);
//  - kill_in_save: sends this process SIGKILL in the middle of the first file (a node lost
//                  while it writes its part);
//  - crash_in_commit: SIGKILL right after the commit's first rename of a checkpoint directory
//                  (step_N -> step_N.old when step N is saved again; else step_N.tmp -> step_N,
//                  before `latest` is updated);
//  - load_io_error, load_permission, load_no_memory: the first file mapped for reading fails
//                  with EIO, EACCES or ENOMEM (a failing disk or NFS server, a permission changed
//                  under the run, a node short of memory).
// Everything else, and every other kind, is passed on unchanged.
#pragma once
#include <atomic>

#include "core/config.h"
#include "core/storage.h"

namespace vidit {

class FaultyStorage : public ForwardingStorage {
 public:
  FaultyStorage(Storage& base, FaultKind kind, double seconds) : ForwardingStorage(base), kind_(kind), seconds_(seconds) {}
  std::unique_ptr<WritableFile> create(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  std::unique_ptr<MappedFile> map(const std::string& path, const std::string& what) override;

 private:
  FaultKind kind_;
  double seconds_;
  std::atomic<int> files_{0}, maps_{0}, renames_{0};
};

}  // namespace vidit
