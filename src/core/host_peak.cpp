// HostPeak (see host_peak.h): a c10 memory reporter that keeps a running sum and its maximum.
#include "core/host_peak.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>

namespace vidit {

struct HostPeak::Reporter : c10::MemoryReportingInfoBase {
  explicit Reporter(std::shared_ptr<Reporter> parent) : parent(std::move(parent)) {}
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (parent) parent->reportMemoryUsage(ptr, alloc_size, total_allocated, total_reserved, device);
    if (!device.is_cpu()) return;  // the CUDA caching allocator reports here too
    current += alloc_size;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return true; }

  std::shared_ptr<Reporter> parent;  // an enclosing HostPeak's, which counts too
  int64_t current = 0, peak = 0;
};

HostPeak::HostPeak() {
  std::shared_ptr<Reporter> parent;
  if (auto* held = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE)) {
    auto* ours = dynamic_cast<Reporter*>(held);
    if (ours == nullptr) return;  // a profiler's: leave it in place (active() is false)
    // The enclosing HostPeak's reporter, kept alive by its guard while this one exists.
    parent = std::shared_ptr<Reporter>(std::shared_ptr<Reporter>{}, ours);
  }
  reporter_ = std::make_shared<Reporter>(std::move(parent));
  guard_ = std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, reporter_);
}

HostPeak::~HostPeak() = default;

int64_t HostPeak::current() const { return reporter_ ? reporter_->current : 0; }
int64_t HostPeak::peak() const { return reporter_ ? reporter_->peak : 0; }
void HostPeak::reset_peak() {
  if (reporter_) reporter_->peak = std::max<int64_t>(reporter_->current, 0);
}

}  // namespace vidit
