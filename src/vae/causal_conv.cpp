#include "vae/causal_conv.h"

#include <cmath>

namespace vidit {

namespace {
// torch.nn.ConvNd's default: kaiming_uniform(a = sqrt(5)) for the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
void default_conv_init(at::Tensor& weight, at::Tensor& bias) {
  const double bound = 1.0 / std::sqrt(double(weight.numel() / weight.size(0)));
  at::NoGradGuard ng;
  weight.uniform_(-bound, bound);
  bias.uniform_(-bound, bound);
}
}  // namespace

VaeConv2dImpl::VaeConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t pad_,
                             const at::TensorOptions& options)
    : stride(stride_), pad(pad_) {
  weight = register_parameter("weight", at::empty({out, in, kernel, kernel}, options));
  bias = register_parameter("bias", at::empty({out}, options));
  default_conv_init(weight, bias);
}

at::Tensor VaeConv2dImpl::forward(const at::Tensor& x) {
  return at::conv2d(x, weight, bias, {stride, stride}, {pad, pad});
}

CausalConv3dImpl::CausalConv3dImpl(int64_t in, int64_t out, int64_t kt, int64_t ks, int64_t time_pad_,
                                   int64_t stride_t_, const at::TensorOptions& options)
    : time_pad(time_pad_), stride_t(stride_t_) {
  weight = register_parameter("weight", at::empty({out, in, kt, ks, ks}, options));
  bias = register_parameter("bias", at::empty({out}, options));
  default_conv_init(weight, bias);
}

at::Tensor CausalConv3dImpl::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor seq = x;
  int64_t zeros_in_front = time_pad;
  if (cache != nullptr && time_pad > 0) {
    auto it = cache->frames.find(this);
    if (it != cache->frames.end()) {
      seq = at::cat({it->second, x}, 2);
      zeros_in_front -= it->second.size(2);
    }
    // Keep what the next chunk needs: the last time_pad frames seen so far (fewer while the clip
    // is shorter than that; the next chunk then pads the rest with zeros, as a whole-clip pass
    // would). A copy, so the cache does not pin the whole chunk's activation.
    const int64_t keep = std::min(time_pad, seq.size(2));
    cache->frames[this] = seq.slice(2, seq.size(2) - keep).clone();
  }
  if (zeros_in_front > 0) {
    auto sizes = seq.sizes().vec();
    sizes[2] = zeros_in_front;
    seq = at::cat({at::zeros(sizes, seq.options()), seq}, 2);
  }
  const int64_t p = weight.size(3) / 2;
  return at::conv3d(seq, weight, bias, {stride_t, 1, 1}, {0, p, p});
}

}  // namespace vidit
