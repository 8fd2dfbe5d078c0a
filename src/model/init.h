// Wan's initialisation as a function of (seed, parameter name, element index) alone.
//
// Each parameter's rule is Wan's: the projections Xavier uniform (the patch embedding's on its
// [dim, C_in*pt*ph*pw] view), the text and time embeddings' weights normal(0, 0.02), biases 0,
// norms' weights 1, the modulations normal(0, 1/sqrt(dim)), the head's projection 0. Each element's
// value is drawn from a counter-based generator (splitmix64 of the seed, the parameter's name and
// the element's index in the whole tensor; normal values by Box-Muller over two such draws), so
// any part of a parameter can be initialised without the rest: a rank that holds 1/N of a weight
// (FSDP's flat shard, tensor parallel's rows) computes exactly the values a one-process run gives
// those elements, in time and memory proportional to its part. A run's weights therefore do not
// depend on its mesh, and no rank ever needs the whole model to start (parallel_model.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace vidit {

struct InitRule {
  enum class Kind { Zeros, Ones, Uniform, Normal };
  Kind kind = Kind::Zeros;
  double scale = 0;  // Uniform: values in [-scale, scale); Normal: the standard deviation (mean 0)
};

// The rule of the DiT parameter `name` (official names) of whole shape `shape`. Throws
// vidit::Error naming a parameter it has no rule for (a new parameter must be given one).
InitRule wan_init_rule(const std::string& name, at::IntArrayRef shape, const ModelConfig& cfg);

// Which elements of a whole tensor a part holds: the box [offset, offset + length) of the whole
// (per dimension; tensor parallel's splits), then, when flat_count >= 0, the elements
// [flat_start, flat_start + flat_count) of that box in row-major order, those past its end being
// padding (FSDP's flat shard). The part's values are in that order.
struct TensorRegion {
  std::vector<int64_t> shape;           // the whole tensor
  std::vector<int64_t> offset, length;  // the box; empty: the whole tensor
  int64_t flat_start = 0, flat_count = -1;
  int64_t numel() const;  // elements in the part (padding included)
};
TensorRegion whole_region(at::IntArrayRef shape);

// Writes the part `region` of the parameter `name` under `rule` and `seed` into `out` (contiguous,
// floating point, region.numel() elements; padding is 0). The same element always gets the same
// value, whatever part it is computed in.
void fill_initial(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name,
                  const TensorRegion& region);

}  // namespace vidit
