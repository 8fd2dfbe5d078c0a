// The memory tensors hold: on a GPU from LibTorch's CUDA caching allocator (what the
// activation-checkpointing policies are measured by: bench/bench_train_step.cpp,
// parallel/activation_memory.h), on the host from glibc's allocator statistics. In a build
// without CUDA the CUDA ones are no-ops (0).
#pragma once
#include <cstdint>

namespace vidit {

// Most bytes allocated by tensors on CUDA device `index` since the last reset.
int64_t cuda_peak_allocated_bytes(int index);
void cuda_reset_peak_memory(int index);
// Bytes allocated by tensors on CUDA device `index` now.
int64_t cuda_allocated_bytes(int index);
// The memory of CUDA device `index`, bytes (0 in a build without CUDA).
int64_t cuda_total_bytes(int index);
// Bytes the process's heap has handed out now (glibc: arena chunks in use plus mmapped blocks);
// LibTorch's CPU tensors come from it.
int64_t host_heap_bytes();
// The host's physical memory (MemTotal of /proc/meminfo), bytes; -1 when it cannot be read.
int64_t host_total_bytes();

}  // namespace vidit
