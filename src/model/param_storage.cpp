#include "model/param_storage.h"

#include <torch/nn/init.h>

#include <cmath>

#include "core/unallocated.h"

namespace vidit {
namespace {
thread_local std::optional<at::Device> without_storage_on;
}  // namespace

BuildWithoutStorage::BuildWithoutStorage(at::Device device) : outer_(without_storage_on) {
  without_storage_on = device;
}

BuildWithoutStorage::~BuildWithoutStorage() { without_storage_on = outer_; }

at::Tensor new_parameter(at::IntArrayRef shape, const std::function<void(at::Tensor&)>& fill) {
  if (without_storage_on) return unallocated(shape, at::TensorOptions().dtype(at::kFloat).device(*without_storage_on));
  at::Tensor t = at::empty(shape, at::kFloat);
  at::NoGradGuard no_grad;
  fill(t);
  return t;
}

void fill_kaiming_weight(at::Tensor& w) { torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0)); }

std::function<void(at::Tensor&)> fill_fan_in_bias(int64_t fan_in) {
  return [fan_in](at::Tensor& b) {
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
    torch::nn::init::uniform_(b, -bound, bound);
  };
}

}  // namespace vidit
