// A Linear layer's weight as the device's fastest matmul wants it, for models that only infer
// (umT5): in fp32 on the CPU, where LibTorch has oneDNN, the weight is packed once (at load)
// into oneDNN's blocked layout and multiplied by its brgemm kernel, the ops TorchInductor's CPU
// freezing uses (mkldnn::_reorder_linear_weight, mkldnn::_linear_pointwise, reached through the
// dispatcher: ATen has no C++ function for them). Otherwise, the dense [out, in] weight for
// at::linear. The same fp32 accumulation either way.
//
// Why: on the 2-core AVX-512 machines this was measured on, the packed weights run umT5's
// projections at ~0.75x the time of the MKL sgemm at::linear calls (MKL's own packed sgemm is no
// faster). CLIP's (257 rows a picture) measured no gain, so it keeps at::linear. bf16 stays on
// at::linear, which already multiplies bf16 with oneDNN on the CPU; packing it measured no clear
// gain.
#pragma once
#include <ATen/ATen.h>

namespace vidit {

class PackedLinear {
 public:
  PackedLinear() = default;
  // `weight` [out, in] and an optional `bias` [out], on their device in their dtype.
  PackedLinear(at::Tensor weight, at::Tensor bias = {});
  // x [..., in] -> [..., out].
  at::Tensor operator()(const at::Tensor& x) const;
  bool packed() const { return packed_; }

 private:
  at::Tensor weight_;  // dense, or a oneDNN-packed (is_mkldnn) tensor
  at::Tensor bias_;
  bool packed_ = false;
};

}  // namespace vidit
