// The widest row (D = heads x head_dim) the fused QK RMSNorm + RoPE kernels take: the backward
// keeps a row of fp32 partial sums and 32 floats of reduction scratch in the 48 KiB of shared
// memory a block gets by default. No torch or CUDA headers, so both sides include it.
#pragma once
#include <cstdint>

namespace vidit {

constexpr int64_t kQkNormRopeMaxDim = (48 * 1024 - 32 * 4) / 4;  // 12256

}  // namespace vidit
