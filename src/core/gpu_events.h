// Time as the GPU sees it. The host returns from a kernel launch, or from a NCCL wait that only
// orders the stream after the collective, long before the device has done the work, so host
// clocks make every GPU rank of a job look equally busy. A CUDA event recorded on the current
// stream marks a point in the stream's work; the time between two is what the device spent
// between them, readable once the second has happened. Without CUDA (a CPU build, a CPU run)
// record_gpu_event gives null and the time between is 0. The CUDA side is
// kernels/gpu_events_cuda.cpp.
#pragma once
#include <memory>

namespace vidit {

class GpuEvent;  // a timing CUDA event
using GpuEventPtr = std::shared_ptr<GpuEvent>;

// An event recorded on CUDA device `device`'s current stream; null when device < 0 or there is
// no CUDA in this build.
GpuEventPtr record_gpu_event(int device);
// An NVTX range (Nsight Systems draws it on the host timeline above the kernels it launched),
// pushed and popped on one thread; no-ops without CUDA. core/trace.h's annotations use them.
void gpu_range_push(const char* name);
void gpu_range_pop();
// The current CUDA device, or -1 (no CUDA in this build, or no GPU).
int current_gpu();
// Makes CUDA device `device` the calling thread's current one: each rank's own GPU, set before
// anything touches CUDA (otherwise every rank of a node synchronizes, records stall events on and
// holds a context on GPU 0). No-op for device < 0 or without CUDA.
void use_gpu(int device);
// Seconds of device time from `from` to `to` (both recorded on one stream); waits for `to`.
// 0 when either is null.
double gpu_seconds_between(const GpuEventPtr& from, const GpuEventPtr& to);

}  // namespace vidit
