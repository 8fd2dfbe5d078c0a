// The Wan 2.1 video VAE: a causal 3D convolutional autoencoder that compresses video 4x in time and
// 8x8 in space into 16 latent channels, so that official weights (wan/modules/vae.py of
// Wan-Video/Wan2.1, "Wan2.1_VAE.pth" and its safetensors conversions) load by their key names.
//
//   video [B, 3, 1+4k, H, W] in [-1, 1]
//     encoder: conv1 -> stages of residual blocks with a Resample after all but the last
//              (spatial /2 each; in time /2 where temporal_downsample says so) -> middle
//              (residual, per-frame attention, residual) -> head (RMSNorm, SiLU, conv to 2*z_dim)
//     conv1 (1x1x1) -> mean, logvar [B, 16, 1+k, H/8, W/8]
//   latents z [B, 16, 1+k, h, w]
//     conv2 (1x1x1) -> decoder: conv1 -> middle -> stages of num_res_blocks+1 residual blocks with
//              an upsampling Resample after all but the last -> head -> video [B, 3, 1+4k, 8h, 8w]
//
// Frame 0 is coded alone (an image is a 1-frame video); every later group of 4 frames becomes one
// latent frame. Every layer is causal in time: latent frame i depends on input frames
// <= 4i only, and decoded frames 4i-3..4i on latent frames <= i.
//
// Runs are chunked in time by default, as officially (frame 0, then chunks of 4 frames to encode;
// one latent frame at a time to decode), with a CausalCache carrying each layer's last frames; the
// result equals a whole-clip pass (VaeRunOptions::chunked = false) to float rounding. Optional
// spatial tiling bounds memory for large frames (tiling.h).
//
// The official release contains no tiling and no dropout (p = 0); dropout is not implemented.
// Checked once against the official PyTorch module (random weights, 13 frames): encode and decode,
// chunked and whole-clip, agree to ~1e-6 relative.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <array>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "vae/causal_conv.h"
#include "vae/tiling.h"
#include "vae/vae_blocks.h"

namespace vidit {

// Per-channel statistics of the Wan 2.1 VAE's latent means over its training data, from the
// official WanVAE wrapper (wan/modules/vae.py): the DiT sees (mu - mean) / std.
inline constexpr std::array<float, 16> kWan21LatentMean = {
    -0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f, -0.1517f, 1.5508f,
    0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
inline constexpr std::array<float, 16> kWan21LatentStd = {
    2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
    3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};

struct WanVAEConfig {
  int64_t base_dim = 96;                       // channels of the first conv; stage s has base_dim * dim_mult[s]
  int64_t z_dim = 16;                          // latent channels (the encoder head makes 2 * z_dim: mean, logvar)
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};  // channel multiplier per stage (encoder order)
  int64_t num_res_blocks = 2;                  // residual blocks per encoder stage; the decoder has one more
  // Per downsampling (encoder order, dim_mult.size() - 1 entries): also halve time? The decoder
  // upsamples in the reverse order.
  std::vector<bool> temporal_downsample = {false, true, true};
  // Latent normalisation (z_dim entries each, or both empty for none); default: Wan 2.1's.
  std::vector<float> latent_mean{kWan21LatentMean.begin(), kWan21LatentMean.end()};
  std::vector<float> latent_std{kWan21LatentStd.begin(), kWan21LatentStd.end()};

  // 2^(number of downsamplings): 8 for Wan 2.1.
  int64_t spatial_factor() const;
  // 2^(number of temporal downsamplings): 4 for Wan 2.1; also the encoder's chunk length.
  int64_t temporal_factor() const;
  // Throws vidit::Error naming the bad field.
  void validate() const;
};

// Spatial tiling (off by default). Sizes are in pixels and must be multiples of spatial_factor();
// encode tiles the frame, decode tiles the latent grid with tile / 8 and stride / 8. A frame no
// larger than `tile` in both dims is never tiled. Defaults are diffusers' AutoencoderKLWan's:
// 256-pixel tiles every 192 pixels (64 pixels = 8 latents of overlap, blended linearly).
struct VaeTiling {
  bool enabled = false;
  int64_t tile = 256;
  int64_t stride = 192;
};

struct VaeRunOptions {
  // Temporal chunks with the causal cache (official; activations of a few frames only). false:
  // the whole clip in one pass; same result, memory grows with the clip length.
  bool chunked = true;
  VaeTiling tiling;
  // The tiles split among processes (vae/tiling.h); nullptr: all here.
  const TileShare* share = nullptr;
};

// Diagonal Gaussian posterior in the network's own (unnormalised) latent space.
struct VaeMoments {
  at::Tensor mean, logvar;  // [B, z_dim, 1 + (T-1)/4, H/8, W/8]
};

struct WanEncoderImpl : torch::nn::Module {
  WanEncoderImpl(const WanVAEConfig& cfg, const at::TensorOptions& options);
  // x [B, 3, T, H, W] -> [B, 2*z_dim, T', H/8, W/8]; cache as in causal_conv.h.
  at::Tensor forward(const at::Tensor& x, CausalCache* cache);
  CausalConv3d conv1{nullptr}, head_conv{nullptr};
  torch::nn::ModuleList downsamples{nullptr}, middle{nullptr};  // of VaeBlock
  ChannelRMSNorm head_norm{nullptr};                             // keys head.0.*, head.2.*
};
TORCH_MODULE(WanEncoder);

struct WanDecoderImpl : torch::nn::Module {
  WanDecoderImpl(const WanVAEConfig& cfg, const at::TensorOptions& options);
  // z [B, z_dim, T', h, w] (after conv2) -> [B, 3, 1 + 4(T'-1), 8h, 8w]
  at::Tensor forward(const at::Tensor& z, CausalCache* cache);
  CausalConv3d conv1{nullptr}, head_conv{nullptr};
  torch::nn::ModuleList middle{nullptr}, upsamples{nullptr};  // of VaeBlock
  ChannelRMSNorm head_norm{nullptr};
};
TORCH_MODULE(WanDecoder);

// Parameter names and shapes equal the official checkpoint's (encoder.*, conv1.*, conv2.*,
// decoder.*). Thread-compatible (a const-free module: one run at a time per instance). Gradients
// flow through every method; wrap calls in torch::NoGradGuard when only caching latents.
struct WanVAEImpl : torch::nn::Module {
  // Builds with PyTorch-default random weights on `options`' device and dtype (use at::kMeta to
  // count or list parameters without memory). Throws vidit::Error on a bad config.
  explicit WanVAEImpl(const WanVAEConfig& cfg = {}, const at::TensorOptions& options = {});

  // video [B, 3, T, H, W], T = 1 + 4k (T % 4 == 1), H and W multiples of 8 -> the posterior's
  // mean and logvar. Throws vidit::Error on any other shape.
  VaeMoments encode(const at::Tensor& video, const VaeRunOptions& opts = {});
  // Raw latents z [B, z_dim, T', h, w] -> video [B, 3, 1 + 4(T'-1), 8h, 8w], not clamped.
  at::Tensor decode(const at::Tensor& z, const VaeRunOptions& opts = {});

  // What the DiT trains on: the normalised posterior mean, (mean - latent_mean) / latent_std
  // (the official WanVAE.encode).
  at::Tensor encode_latents(const at::Tensor& video, const VaeRunOptions& opts = {});
  // Inverse of the above, then decode, then clamp to [-1, 1] (the official WanVAE.decode).
  at::Tensor decode_latents(const at::Tensor& latents, const VaeRunOptions& opts = {});

  // (mu - mean) * (1 / std) and z * std + mean, per channel (dim 1); identity without statistics.
  at::Tensor normalize_latents(const at::Tensor& mu) const;
  at::Tensor denormalize_latents(const at::Tensor& latents) const;

  WanVAEConfig cfg;
  WanEncoder encoder{nullptr};
  CausalConv3d conv1{nullptr}, conv2{nullptr};  // 1x1x1: 2*z_dim -> 2*z_dim, z_dim -> z_dim
  WanDecoder decoder{nullptr};

 private:
  at::Tensor encode_untiled(const at::Tensor& video, bool chunked);  // [B, 2*z_dim, ...]
  at::Tensor decode_untiled(const at::Tensor& z, bool chunked);
};
TORCH_MODULE(WanVAE);

// Copies the tensors of a Wan 2.1 VAE state dict into `vae` (casting dtype), strictly, in either
// layout (vae/vae_layout.h: official names, or diffusers' AutoencoderKLWan names, judged by the
// names): throws vidit::Error naming `source` and every missing, unexpected or mis-shaped key; nothing
// is written unless all match.
void load_wan_vae(WanVAEImpl& vae, const TensorMap& tensors, const std::string& source);
// Same, reading `path`: a .safetensors file (Wan2.1_VAE.safetensors, keys as in Wan2.1_VAE.pth, or
// diffusers' names), a diffusers vae/ folder or a diffusers pipeline folder (find_vae_files). A
// diffusers config.json is first checked against vae.cfg (shapes and latent statistics).
void load_wan_vae(WanVAEImpl& vae, const std::string& path);
// A VAE built for `path` and loaded from it: of the shape its diffusers config.json states
// (find_vae_files), else Wan 2.1's, on `options`' device, in eval mode.
WanVAE open_wan_vae(const std::string& path, const at::TensorOptions& options = {});

}  // namespace vidit
