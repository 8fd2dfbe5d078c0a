#include "vae/vae_blocks.h"

#include <cmath>

#include "core/error.h"

namespace vidit {

namespace {

// Runs a 2D layer on every frame: [B, C, T, H, W] -> [B*T, C, H, W] -> fn -> [B, C', T, H', W'].
template <typename Fn>
at::Tensor per_frame(const at::Tensor& x, Fn&& fn) {
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2);
  at::Tensor y = fn(x.permute({0, 2, 1, 3, 4}).reshape({B * T, C, x.size(3), x.size(4)}));
  return y.reshape({B, T, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
}

}  // namespace

void register_indexed(torch::nn::Module& parent, const std::string& name,
                      const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& children) {
  auto holder = parent.register_module(name, std::make_shared<torch::nn::Module>(name));
  for (const auto& [index, child] : children) holder->register_module(index, child);
}

ChannelRMSNormImpl::ChannelRMSNormImpl(int64_t channels, bool video, const at::TensorOptions& options)
    : scale(std::sqrt(double(channels))) {
  std::vector<int64_t> shape = video ? std::vector<int64_t>{channels, 1, 1, 1} : std::vector<int64_t>{channels, 1, 1};
  gamma = register_parameter("gamma", at::ones(shape, options));
}

at::Tensor ChannelRMSNormImpl::forward(const at::Tensor& x) {
  VIDIT_CHECK(x.dim() == gamma.dim() + 1, "ChannelRMSNorm: input has ", x.dim(), " dims, expected ",
              gamma.dim() + 1, " (channels at dim 1)");
  // Same arithmetic as torch.nn.functional.normalize(x, dim=1), eps 1e-12.
  return x / x.norm(2, at::IntArrayRef{1}, /*keepdim=*/true).clamp_min(1e-12) * (scale * gamma);
}

ResidualBlock::ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options) {
  norm1 = ChannelRMSNorm(in, true, options);
  conv1 = CausalConv3d(in, out, 3, 3, /*time_pad=*/2, 1, options);
  norm2 = ChannelRMSNorm(out, true, options);
  conv2 = CausalConv3d(out, out, 3, 3, /*time_pad=*/2, 1, options);
  register_indexed(*this, "residual",
                   {{"0", norm1.ptr()}, {"2", conv1.ptr()}, {"3", norm2.ptr()}, {"6", conv2.ptr()}});
  if (in != out) shortcut = register_module("shortcut", CausalConv3d(in, out, 1, 1, 0, 1, options));
}

at::Tensor ResidualBlock::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = shortcut ? shortcut->forward(x) : x;
  at::Tensor y = conv1->forward(at::silu(norm1->forward(x)), cache);
  y = conv2->forward(at::silu(norm2->forward(y)), cache);
  return y + h;
}

AttentionBlock::AttentionBlock(int64_t channels, const at::TensorOptions& options) {
  norm = register_module("norm", ChannelRMSNorm(channels, false, options));
  to_qkv = register_module("to_qkv", VaeConv2d(channels, 3 * channels, 1, 1, 0, options));
  proj = register_module("proj", VaeConv2d(channels, channels, 1, 1, 0, options));
  at::NoGradGuard ng;
  proj->weight.zero_();
}

at::Tensor AttentionBlock::forward(const at::Tensor& x, CausalCache* /*cache*/) {
  return x + per_frame(x, [&](const at::Tensor& f) {
           const int64_t N = f.size(0), C = f.size(1), H = f.size(2), W = f.size(3);
           // [N, 3C, H, W] -> [N, 1 head, H*W, 3C] -> q, k, v [N, 1, H*W, C]
           at::Tensor qkv = to_qkv->forward(norm->forward(f)).reshape({N, 1, 3 * C, H * W}).transpose(2, 3);
           auto parts = qkv.chunk(3, -1);
           at::Tensor o = at::scaled_dot_product_attention(parts[0].contiguous(), parts[1].contiguous(),
                                                           parts[2].contiguous());
           return proj->forward(o.squeeze(1).transpose(1, 2).reshape({N, C, H, W}));
         });
}

Resample::Resample(int64_t channels, ResampleMode mode_, const at::TensorOptions& options) : mode(mode_) {
  const bool up = mode == ResampleMode::Up2d || mode == ResampleMode::Up3d;
  VIDIT_CHECK(!up || channels % 2 == 0, "Resample: upsampling halves the channels, got ", channels);
  conv = up ? VaeConv2d(channels, channels / 2, 3, 1, 1, options) : VaeConv2d(channels, channels, 3, 2, 0, options);
  register_indexed(*this, "resample", {{"1", conv.ptr()}});
  if (mode == ResampleMode::Up3d)
    time_conv = register_module("time_conv", CausalConv3d(channels, 2 * channels, 3, 1, /*time_pad=*/2, 1, options));
  if (mode == ResampleMode::Down3d)
    time_conv = register_module("time_conv", CausalConv3d(channels, channels, 3, 1, /*time_pad=*/0, 2, options));
}

at::Tensor Resample::forward(const at::Tensor& x_in, CausalCache* cache) {
  at::Tensor x = x_in;
  const bool first_chunk = cache == nullptr || cache->first_chunk;
  if (mode == ResampleMode::Up3d) {
    // Frame 0 of the clip is not doubled; every later frame becomes two.
    at::Tensor rest = first_chunk ? x.slice(2, 1) : x;
    if (rest.size(2) > 0) {
      const int64_t B = rest.size(0), C = rest.size(1), T = rest.size(2), H = rest.size(3), W = rest.size(4);
      at::Tensor two = time_conv->forward(rest, cache).view({B, 2, C, T, H, W});
      rest = two.permute({0, 2, 3, 1, 4, 5}).reshape({B, C, 2 * T, H, W});  // t0a t0b t1a t1b ...
    }
    x = !first_chunk ? rest : rest.size(2) > 0 ? at::cat({x.slice(2, 0, 1), rest}, 2) : x.slice(2, 0, 1);
  }

  x = per_frame(x, [&](const at::Tensor& f) {
    if (mode == ResampleMode::Up2d || mode == ResampleMode::Up3d) {
      // Nearest x2; for an exact factor of 2 this equals the official 'nearest-exact' mode
      // (source index floor((i + 0.5) / 2) == floor(i / 2) for every integer i).
      return conv->forward(at::upsample_nearest2d(f, {2 * f.size(2), 2 * f.size(3)}));
    }
    return conv->forward(at::constant_pad_nd(f, {0, 1, 0, 1}));  // pad right and bottom
  });

  if (mode == ResampleMode::Down3d) {
    // Stride-2 windows [0,1,2], [2,3,4], ... over the clip: frame 0 alone, then one frame per two.
    // A later chunk (an even number of frames) is prepended with the last frame of the previous.
    const int64_t T = x.size(2);
    at::Tensor out;
    if (first_chunk) {
      VIDIT_CHECK(T % 2 == 1, "temporal downsampling needs 1 + 2k frames at its input, got ", T,
                  ": encode clips of 1 + 4k frames");
      out = T >= 3 ? at::cat({x.slice(2, 0, 1), time_conv->forward(x)}, 2) : x;
    } else {
      auto it = cache->frames.find(this);
      VIDIT_CHECK(it != cache->frames.end() && T % 2 == 0,
                  "temporal downsampling: a later chunk needs an even number of frames, got ", T);
      out = time_conv->forward(at::cat({it->second, x}, 2));
    }
    if (cache != nullptr) cache->frames[this] = x.slice(2, T - 1).clone();
    x = out;
  }
  return x;
}

}  // namespace vidit
