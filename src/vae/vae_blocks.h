// Building blocks of the Wan 2.1 video VAE: the channel RMS norm, the residual block, the per-frame
// attention block and the resampling layers (spatial down/up by 2, optionally also in time).
// Parameter names equal the official keys (wan/modules/vae.py in Wan-Video/Wan2.1): where the
// official code indexes into an nn.Sequential (`residual.0.gamma`, `residual.6.weight`,
// `resample.1.weight`) the same index names are registered here.
//
// Shapes: video activations are [B, C, T, H, W]; 2D layers run on every frame independently.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "vae/causal_conv.h"

namespace vidit {

// Normalises over the channel dim: x / max(||x||_2, 1e-12) * sqrt(C) * gamma, i.e. RMS
// normalisation with a learned per-channel scale `gamma` and no bias (the release has none).
// gamma is [C, 1, 1, 1] for video activations, [C, 1, 1] for the per-frame attention input.
struct ChannelRMSNormImpl : torch::nn::Module {
  ChannelRMSNormImpl(int64_t channels, bool video, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor gamma;
  double scale;  // sqrt(channels)
};
TORCH_MODULE(ChannelRMSNorm);

// A layer of the encoder / decoder stacks. `cache` is null for a whole-clip pass, else the clip's
// chunk state (causal_conv.h).
struct VaeBlock : torch::nn::Module {
  virtual at::Tensor forward(const at::Tensor& x, CausalCache* cache) = 0;
};

// x + residual(x): RMSNorm, SiLU, causal 3x3x3 conv, RMSNorm, SiLU, causal 3x3x3 conv; a 1x1x1
// `shortcut` conv when the channel count changes. Keys: residual.{0,3}.gamma,
// residual.{2,6}.{weight,bias}, shortcut.{weight,bias}. (Official index 5 is a dropout with p = 0
// in the release; it has no parameters and is left out.)
struct ResidualBlock : VaeBlock {
  ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  ChannelRMSNorm norm1{nullptr}, norm2{nullptr};
  CausalConv3d conv1{nullptr}, conv2{nullptr}, shortcut{nullptr};  // shortcut null when in == out
};

// Single-head self-attention over the H*W positions of each frame separately (so it never mixes
// frames and stays causal), with a residual. Keys: norm.gamma [C,1,1], to_qkv (1x1 conv C -> 3C),
// proj (1x1 conv C -> C, weight zero-initialised as officially).
struct AttentionBlock : VaeBlock {
  AttentionBlock(int64_t channels, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  ChannelRMSNorm norm{nullptr};
  VaeConv2d to_qkv{nullptr}, proj{nullptr};
};

enum class ResampleMode { Down2d, Down3d, Up2d, Up3d };

// Spatial resampling by 2 on every frame, and for the 3d modes also in time:
//   Down2d: zero-pad right/bottom by 1, 3x3 conv stride 2 (C -> C)            key resample.1
//   Down3d: the same, then `time_conv` (kernel 3 in time, stride 2, no padding) over the frames
//           after frame 0: T = 1 + 2k frames -> 1 + k (frame 0 passes through alone).
//   Up2d:   nearest x2, 3x3 conv (C -> C/2)                                    key resample.1
//   Up3d:   first `time_conv` (causal, kernel 3, C -> 2C) on the frames after frame 0; each output
//           frame's two channel halves become two frames: T = 1 + k -> 1 + 2k; then as Up2d.
// Frame 0 passing through alone is what makes the codec 1 + 4k frames <-> 1 + k latents.
struct Resample : VaeBlock {
  Resample(int64_t channels, ResampleMode mode, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  ResampleMode mode;
  VaeConv2d conv{nullptr};
  CausalConv3d time_conv{nullptr};  // null for the 2d modes
};

// Registers `children` under `parent` in a parameter-less holder called `name`, so that their
// keys read name.<child>.* (how an official nn.Sequential names its layers).
void register_indexed(torch::nn::Module& parent, const std::string& name,
                      const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& children);

}  // namespace vidit
