#include "core/gpu_events.h"

namespace vidit {

#ifndef VIDIT_HAVE_CUDA
GpuEventPtr record_gpu_event(int) { return nullptr; }
int current_gpu() { return -1; }
void use_gpu(int) {}
void gpu_range_push(const char*) {}
void gpu_range_pop() {}
double gpu_seconds_between(const GpuEventPtr&, const GpuEventPtr&) { return 0; }
#endif

}  // namespace vidit
