// The GPU memory a run holds at its peak, from LibTorch's CUDA caching allocator: what the
// activation-checkpointing policies are measured by (bench/bench_train_step.cpp). In a build
// without CUDA both are no-ops (0).
#pragma once
#include <cstdint>

namespace vidit {

// Most bytes allocated by tensors on CUDA device `index` since the last reset.
int64_t cuda_peak_allocated_bytes(int index);
void cuda_reset_peak_memory(int index);

}  // namespace vidit
