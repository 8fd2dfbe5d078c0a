#include "core/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vidit {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit; blocks above it still use mmap.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  mallopt(M_TOP_PAD, 64 << 20);  // grow the heap in large steps: fewer brk calls
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace vidit
