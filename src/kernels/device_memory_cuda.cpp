// CUDA builds only: peak memory from the caching allocator (core/device_memory.h).
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include "core/device_memory.h"

namespace vidit {

int64_t cuda_peak_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(index));
  return stats.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

int64_t cuda_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(index));
  return stats.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

int64_t cuda_total_bytes(int index) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, index) == cudaSuccess ? int64_t(prop.totalGlobalMem) : 0;
}

void cuda_reset_peak_memory(int index) { c10::cuda::CUDACachingAllocator::resetPeakStats(c10::DeviceIndex(index)); }

}  // namespace vidit
