// Where the model's modules put their parameters when they are built.
//
// By default a parameter is allocated and filled as LibTorch's own modules fill theirs (Kaiming
// uniform from the global generator, ones, zeros), in the same order, so a model built and then
// given Wan's initialisation (DiTImpl::init_weights) is what it always was. Inside a
// BuildWithoutStorage scope every parameter is instead an unallocated tensor on the scope's
// device (core/unallocated.h): the model is a description of shapes, no bytes and no random
// draws, that parallelize() can cut before each rank allocates and initialises only its part
// (parallel/parallel_model.h, model/init.h). This is LibTorch's meta-device construction for C++
// modules, which have no default-device context.
//
// The scope is per thread and nests; it changes nothing but the model's own modules (layers.h,
// dit.h), which make their parameters through new_parameter().
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <optional>

namespace vidit {

class BuildWithoutStorage {
 public:
  explicit BuildWithoutStorage(at::Device device);
  ~BuildWithoutStorage();
  BuildWithoutStorage(const BuildWithoutStorage&) = delete;
  BuildWithoutStorage& operator=(const BuildWithoutStorage&) = delete;

 private:
  std::optional<at::Device> outer_;
};

// A new fp32 parameter of `shape`: allocated on the CPU and given `fill` (which may draw from
// the global generator), or, inside a BuildWithoutStorage scope, unallocated on its device with
// `fill` not called.
at::Tensor new_parameter(at::IntArrayRef shape, const std::function<void(at::Tensor&)>& fill);

// LibTorch's default fills for a layer with `fan_in` inputs: weight Kaiming uniform (a = sqrt(5)),
// bias uniform in +-1/sqrt(fan_in).
void fill_kaiming_weight(at::Tensor& w);
std::function<void(at::Tensor&)> fill_fan_in_bias(int64_t fan_in);

}  // namespace vidit
