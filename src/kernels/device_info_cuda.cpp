// CUDA builds only: the device name the MFU table (core/peak_flops.h) is looked up by.
#include <ATen/cuda/CUDAContext.h>

#include "core/peak_flops.h"

namespace vidit {

std::string cuda_device_name(int index) { return at::cuda::getDeviceProperties(index)->name; }

}  // namespace vidit
