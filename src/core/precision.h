// Mixed precision. "bf16": autocast runs matmuls and attention in bfloat16 while the model keeps
// norms, modulation, RoPE and the residual stream in fp32 and the optimizer keeps fp32 master
// weights. "fp8" / "fp8_rowwise": bf16, and the projections inside the blocks multiply in FP8
// (model/fp8.h). "fp32": everything in fp32 (the CPU default: bf16 is slow on most CPUs).
#pragma once
#include <ATen/autocast_mode.h>

#include <string>

#include "core/config.h"

namespace vidit {

// bf16 autocast is on in this precision (every one but fp32).
inline bool autocasts_bf16(Precision p) { return p != Precision::fp32; }

// RAII: enables bf16 autocast on `device` for its lifetime when autocasts_bf16(precision) (and leaves
// the state alone otherwise); or sets exactly a state captured earlier (`enabled`, `dtype`),
// e.g. to recompute a forward in backward as it first ran (model/recompute.h).
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, at::DeviceType device) : device_(device) {
    if (autocasts_bf16(precision)) set(true, at::kBFloat16);
  }
  AutocastGuard(at::DeviceType device, bool enabled, at::ScalarType dtype) : device_(device) { set(enabled, dtype); }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_, prev_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  void set(bool enabled, at::ScalarType dtype) {
    active_ = true;
    prev_enabled_ = at::autocast::is_autocast_enabled(device_);
    prev_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_enabled(device_, enabled);
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::increment_nesting();
  }
  at::DeviceType device_;
  bool active_ = false, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace vidit
