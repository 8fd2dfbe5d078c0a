#include "core/device_memory.h"

#include <fstream>
#include <string>

#include <malloc.h>

namespace vidit {

#ifndef VIDIT_HAVE_CUDA
int64_t cuda_peak_allocated_bytes(int) { return 0; }
int64_t cuda_total_bytes(int) { return 0; }
void cuda_reset_peak_memory(int) {}
int64_t cuda_allocated_bytes(int) { return 0; }
#endif

int64_t host_heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return int64_t(m.uordblks + m.hblkhd);
}

int64_t host_total_bytes() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("MemTotal:", 0) == 0) return int64_t(std::stod(line.substr(9))) * 1024;  // kB
  return -1;
}

}  // namespace vidit
