// Storage that fails the way disks fail (fault injection, resilience/fault_injection.h): a
// ForwardingStorage (core/storage.h) over the real one that, for the files created through it,
//  - disk_full:    fails a write in the middle of the first file with ENOSPC;
//  - io_error:     fails the first fsync with EIO (what a dying disk or a lost NFS server does);
//  - slow_storage: takes `seconds` longer for every file (a congested parallel file system);
//  - kill_in_save: sends this process SIGKILL in the middle of the first file (a node lost
//                  while it writes its part).
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

 private:
  FaultKind kind_;
  double seconds_;
  std::atomic<int> files_{0};
};

}  // namespace vidit
