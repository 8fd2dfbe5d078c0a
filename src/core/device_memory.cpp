#include "core/device_memory.h"

namespace vidit {

#ifndef VIDIT_HAVE_CUDA
int64_t cuda_peak_allocated_bytes(int) { return 0; }
void cuda_reset_peak_memory(int) {}
#endif

}  // namespace vidit
