// The peak of ATen's host (CPU) allocations over a stretch of code, counted to the byte.
//
// c10's CPU allocator tells a memory reporter about every allocation and every free when one is
// installed in the calling thread's debug info (c10::DebugInfoKind::PROFILER_STATE: the hook the
// PyTorch profiler's profile_memory uses). HostPeak installs its own for its lifetime and keeps
// the running sum of the bytes allocated since it began less the bytes freed, and that sum's
// maximum: the most host memory the stretch added above what was live when it started. The
// process's peak resident set (ru_maxrss) cannot say this: it only ever grows, and it also holds
// the allocator's cached pages, mapped files and everything else the process touched.
//
// What it sees: allocations through c10's CPU allocator on the thread that made the HostPeak
// (tensors, and the scratch ATen's kernels allocate before they fan out). Not seen: malloc by
// other code (a file read into a std::string, mapped weight files), nor a buffer an intra-op
// worker thread allocates inside a parallel region (ATen's OpenMP workers do not inherit the
// debug info). A free is reported only for a block c10 saw allocated while some reporter was on,
// so a tensor made before any HostPeak and freed inside one does not lower the sum (c10 logs a
// warning, once per thousand, for such frees).
//
// Nesting: a HostPeak made while another is active on the thread chains to it, so both count.
// When a profiler already holds the hook, HostPeak does not displace it and active() is false.
// Not thread-safe: make, query and destroy it on one thread.
#pragma once
#include <cstdint>
#include <memory>

namespace c10 {
class DebugInfoGuard;
}

namespace vidit {

class HostPeak {
 public:
  HostPeak();  // starts counting on this thread
  ~HostPeak();
  HostPeak(const HostPeak&) = delete;
  HostPeak& operator=(const HostPeak&) = delete;

  bool active() const { return guard_ != nullptr; }
  int64_t current() const;  // bytes allocated since the start, less those freed (may be < 0)
  int64_t peak() const;     // the largest current() so far; >= 0
  void reset_peak();        // peak() starts again from current()

  struct Reporter;

 private:
  std::shared_ptr<Reporter> reporter_;
  std::unique_ptr<c10::DebugInfoGuard> guard_;
};

}  // namespace vidit
