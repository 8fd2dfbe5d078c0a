// Which fused kernel scaled-dot-product attention runs (train.attention_backend).
//
// ATen's SDPA picks among flash attention, cuDNN, memory-efficient attention and the plain
// math composition by the inputs' device, dtype and shape, in its own order of preference. A
// run can pin one instead: select_attention_backend() turns ATen's global switches off for the
// others, so a kernel that cannot take the inputs is an error at the first check, not a silent
// fall back to a slower one. attention_backend_for() asks ATen which kernel it would run for the
// run's shape; the trainer logs it at the start, so the log says what ran. The CPU has the
// math and flash kernels only.
#pragma once
#include <string>

#include <ATen/ATen.h>

#include "core/config.h"

namespace vidit {

// Sets ATen's SDPA switches (process-wide) for `backend` on `device`; throws, naming
// train.attention_backend, when the device has no such kernel.
void select_attention_backend(AttentionBackend backend, const at::Device& device);

// The kernel SDPA runs for attention over [batch, heads, tokens, head_dim] inputs of `dtype` on
// `device` ("flash", "cudnn", "efficient", "math"); throws, naming train.attention_backend and
// ATen's reason, when the switches leave none that can.
std::string attention_backend_for(int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                                  at::ScalarType dtype, const at::Device& device);

}  // namespace vidit
