// Peak dense matmul throughput of the accelerators vidit is used on, for MFU (model FLOPs
// utilisation: achieved training FLOP/s over what the devices could do). The figures are the
// vendors' dense (no sparsity) tensor-core numbers per device: bf16 for train.precision =
// "bf16", TF32 for "fp32". An FP8 run is measured against the bf16 figure too (only the
// blocks' projections run in FP8), so the MFU of an FP8 run and a bf16 run compare directly. A device not in the table gives 0 (unknown: no MFU is reported);
// train.peak_tflops overrides the table.
#pragma once
#include <string>

#include "core/config.h"

namespace vidit {

// TFLOP/s per device for a CUDA device name ("NVIDIA H100 80GB HBM3", ...); 0 when unknown.
double peak_tflops(const std::string& device_name, Precision precision);

// The name of CUDA device `index` ("" in a build without CUDA).
std::string cuda_device_name(int index);

}  // namespace vidit
