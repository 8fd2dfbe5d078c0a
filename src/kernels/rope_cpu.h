// Fused rotary position embedding for CPU tensors. Each pair (x[2i], x[2i+1]) of a head's
// channels turns by the angle of its token and frequency:
//   y[2i]   = x[2i] * cos - x[2i+1] * sin,   y[2i+1] = x[2i] * sin + x[2i+1] * cos
// x [B, L, H, hd] fp32/fp64 (contiguous), cos/sin [L, hd/2] (no gradient). The backward is the
// same turn by the opposite angle. One pass each way, where the ATen composition (select, four
// muls, add, sub, stack) runs eight ops forward and more backward. rope_composite() is that
// composition, the reference in tests and the path for other devices.
#pragma once
#include <ATen/ATen.h>

namespace vidit {

at::Tensor rope_cpu_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace vidit
