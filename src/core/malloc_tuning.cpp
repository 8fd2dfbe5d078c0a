#include "core/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vidit {

namespace {
bool kept = false;  // keep_freed_memory() is in force
}  // namespace

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit; blocks above it still use mmap.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  mallopt(M_TOP_PAD, 64 << 20);  // grow the heap in large steps: fewer brk calls
  kept = mmap_ok && trim_ok;
  return kept;
#else
  return false;
#endif
}

ScopedFreshMappings::ScopedFreshMappings() {
#if defined(__GLIBC__)
  restore_ = kept;
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
}

ScopedFreshMappings::~ScopedFreshMappings() {
#if defined(__GLIBC__)
  if (restore_) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  malloc_trim(0);
#endif
}

}  // namespace vidit
