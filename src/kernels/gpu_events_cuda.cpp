// CUDA builds only: timing events on the current stream and NVTX ranges (core/gpu_events.h).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <nvtx3/nvToolsExt.h>

#include "core/gpu_events.h"

namespace vidit {

class GpuEvent {
 public:
  at::cuda::CUDAEvent event{cudaEventDefault};  // timing on (ATen's default disables it)
};

GpuEventPtr record_gpu_event(int device) {
  if (device < 0) return nullptr;
  auto e = std::make_shared<GpuEvent>();
  e->event.record(at::cuda::getCurrentCUDAStream(c10::DeviceIndex(device)));
  return e;
}

void gpu_range_push(const char* name) { nvtxRangePushA(name); }
void gpu_range_pop() { nvtxRangePop(); }

void use_gpu(int device) {
  if (device >= 0) c10::cuda::set_device(c10::DeviceIndex(device));
}

int current_gpu() { return at::cuda::device_count() > 0 ? int(at::cuda::current_device()) : -1; }

double gpu_seconds_between(const GpuEventPtr& from, const GpuEventPtr& to) {
  if (!from || !to) return 0;
  to->event.synchronize();
  return double(from->event.elapsed_time(to->event)) * 1e-3;  // milliseconds
}

}  // namespace vidit
