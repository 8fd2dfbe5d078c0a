// The Wan 2.2 video VAE (the VAE of Wan2.2-TI2V-5B): a causal 3D convolutional autoencoder that
// compresses video 4x in time and 16x16 in space into 48 latent channels. Its parameters are named
// as diffusers' AutoencoderKLWan(is_residual=True) names them, so a diffusers vae/ folder loads by
// name with no renaming.
//
// What differs from the Wan 2.1 VAE (wan_vae.h), whose causal convolutions, norms, attention and
// downsampling layers it reuses:
//   - 2x2 patchify: RGB frames become 12 channels at half the height and width before the
//     encoder, and the decoder's 12 output channels become RGB at twice the size (the spatial
//     factor is patch_size * 2^(downsamplings) = 16);
//   - every stage of the encoder and decoder is a block with a parameter-free shortcut around it:
//     encoder stages add the stage input averaged down to the stage output's shape (groups of
//     neighbouring pixels / frames / channels averaged), decoder stages add the stage input copied
//     up to the output's shape (each value repeated over a 2x2 (x2 in time) cell and over channels);
//   - the decoder has its own width (decoder_base_dim), and its upsampling layers keep the channel
//     count instead of halving it.
//
//   video [B, 3, 1+4k, H, W] in [-1, 1] -> patchify [B, 12, 1+4k, H/2, W/2]
//     encoder: conv_in -> down_blocks (residual blocks, then a spatial (and temporal) downsampler;
//              plus the averaged shortcut) -> mid_block (residual, per-frame attention, residual)
//              -> norm_out, SiLU, conv_out (2 * z_dim)
//     quant_conv (1x1x1) -> mean, logvar [B, 48, 1+k, H/16, W/16]
//   latents z [B, 48, 1+k, h, w]
//     post_quant_conv (1x1x1) -> decoder: conv_in -> mid_block -> up_blocks (num_res_blocks + 1
//              residual blocks, then an upsampler; plus the copied shortcut; the last block has
//              neither) -> norm_out, SiLU, conv_out (12) -> unpatchify [B, 3, 1+4k, 16h, 16w]
//
// Frame 0 is coded alone, every later group of 4 frames becomes one latent frame. Runs are chunked
// in time as diffusers runs them (frame 0, then 4 frames at a time to encode; one latent frame at a
// time to decode, the first being "the first chunk": its temporal upsamplers pass the frame through
// undoubled and the copied shortcuts keep only its last copy), with a CausalCache carrying each
// causal layer's last frames. VaeRunOptions::chunked = false runs the whole clip in one pass with
// the same result (diffusers has no such mode). Spatial tiling (VaeRunOptions::tiling) reuses
// tiling.h's blend; unlike the untiled run it is not compared with diffusers, whose tiled blend
// differs.
//
// wan22_vae_test.cpp compares encode and decode with diffusers' own on a small random model
// (tests/reference/diffusers_vae22_reference.py). The official Wan2.2_VAE.pth names
// (Wan-Video/Wan2.2) are not read: give diffusers' vae/ folder (Wan-AI/Wan2.2-TI2V-5B-Diffusers).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <array>
#include <string>
#include <vector>

#include "vae/causal_conv.h"
#include "vae/vae_blocks.h"
#include "vae/wan_vae.h"  // VaeMoments, VaeRunOptions

namespace vidit {

// Per-channel statistics of the Wan 2.2 VAE's latents (diffusers' latents_mean / latents_std of
// Wan2.2-TI2V-5B-Diffusers/vae/config.json): the DiT sees (mu - mean) / std.
inline constexpr std::array<float, 48> kWan22LatentMean = {
    -0.2289f, -0.0052f, -0.1323f, -0.2339f, -0.2799f, 0.0174f,  0.1838f,  0.1557f,  -0.1382f, 0.0542f,
    0.2813f,  0.0891f,  0.1570f,  -0.0098f, 0.0375f,  -0.1825f, -0.2246f, -0.1207f, -0.0698f, 0.5109f,
    0.2665f,  -0.2108f, -0.2158f, 0.2502f,  -0.2055f, -0.0322f, 0.1109f,  0.1567f,  -0.0729f, 0.0899f,
    -0.2799f, -0.1230f, -0.0313f, -0.1649f, 0.0117f,  0.0723f,  -0.2839f, -0.2083f, -0.0520f, 0.3748f,
    0.0152f,  0.1957f,  0.1433f,  -0.2944f, 0.3573f,  -0.0548f, -0.1681f, -0.0667f};
inline constexpr std::array<float, 48> kWan22LatentStd = {
    0.4765f, 1.0364f, 0.4514f, 1.1677f, 0.5313f, 0.4990f, 0.4818f, 0.5013f, 0.8158f, 1.0344f,
    0.5894f, 1.0901f, 0.6885f, 0.6165f, 0.8454f, 0.4978f, 0.5759f, 0.3523f, 0.7135f, 0.6804f,
    0.5833f, 1.4146f, 0.8986f, 0.5659f, 0.7069f, 0.5338f, 0.4889f, 0.4917f, 0.4069f, 0.4999f,
    0.6866f, 0.4093f, 0.5709f, 0.6065f, 0.6415f, 0.4944f, 0.5726f, 1.2042f, 0.5458f, 1.6887f,
    0.3971f, 1.0600f, 0.3943f, 0.5537f, 0.5444f, 0.4089f, 0.7468f, 0.7744f};

struct Wan22VAEConfig {
  int64_t base_dim = 160;          // encoder: channels of conv_in; stage s has base_dim * dim_mult[s]
  int64_t decoder_base_dim = 256;  // decoder: stage s (decoder order) has decoder_base_dim * dim_mult[reversed s]
  int64_t z_dim = 48;              // latent channels (the encoder makes 2 * z_dim: mean, logvar)
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};  // channel multiplier per stage (encoder order)
  int64_t num_res_blocks = 2;      // residual blocks per encoder stage; each decoder stage has one more
  // Per downsampling (encoder order, dim_mult.size() - 1 entries): also halve time? The decoder
  // upsamples in the reverse order.
  std::vector<bool> temporal_downsample = {false, true, true};
  int64_t patch_size = 2;  // RGB pixels patch_size x patch_size -> 3 * patch_size^2 channels
  // Latent normalisation (z_dim entries each, or both empty for none); default: Wan 2.2's.
  std::vector<float> latent_mean{kWan22LatentMean.begin(), kWan22LatentMean.end()};
  std::vector<float> latent_std{kWan22LatentStd.begin(), kWan22LatentStd.end()};

  // Channels the encoder reads and the decoder writes: 3 * patch_size^2 (12).
  int64_t patch_channels() const;
  // patch_size * 2^(number of downsamplings): 16 for Wan 2.2.
  int64_t spatial_factor() const;
  // 2^(number of temporal downsamplings): 4 for Wan 2.2; also the encoder's chunk length.
  int64_t temporal_factor() const;
  // Throws vidit::Error naming the bad field.
  void validate() const;
};

// One residual block, diffusers' WanResidualBlock names: x + conv2(SiLU(norm2(conv1(SiLU(norm1(x))))))
// with causal 3x3x3 convs; `conv_shortcut` (1x1x1) replaces x when the channel count changes.
// Keys norm1.gamma, conv1.*, norm2.gamma, conv2.*, conv_shortcut.* (vae_blocks.h's ResidualBlock
// is the same arithmetic under the official names).
struct Wan22ResidualBlock : VaeBlock {
  Wan22ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  ChannelRMSNorm norm1{nullptr}, norm2{nullptr};
  CausalConv3d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};  // conv_shortcut null when in == out
};

// resnets.0, attentions.0 (vae_blocks.h's AttentionBlock), resnets.1, in that order.
struct Wan22MidBlock : VaeBlock {
  Wan22MidBlock(int64_t channels, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
};

// An encoder stage: `resnets` (in -> out, then out -> out), then `downsampler` (vae_blocks.h's
// Resample, Down2d or Down3d; null in the last stage), plus the stage input averaged down to the
// output's shape: time padded in front with zero frames to a multiple of factor_t, then every
// (channel, factor_t frames, factor_s x factor_s pixels) cell flattened in that order and each run
// of in * factor_t * factor_s^2 / out consecutive values averaged into one output channel.
struct Wan22DownBlock : VaeBlock {
  Wan22DownBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool down, bool in_time,
                 const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  torch::nn::ModuleList resnets{nullptr};
  std::shared_ptr<Resample> downsampler;  // null in the last stage
  int64_t out_channels, factor_t, factor_s;
};

// The decoder's upsampling layer (diffusers' WanResample in upsample2d / upsample3d mode with as
// many output as input channels): in time (temporal only) a causal `time_conv` (kernel 3, C -> 2C)
// whose two channel halves become two frames, frame 0 of the clip passing through alone; then every
// frame nearest x2 and a 3x3 conv `resample.1` (C -> C).
struct Wan22Upsample : VaeBlock {
  Wan22Upsample(int64_t channels, bool in_time, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  VaeConv2d conv{nullptr};
  CausalConv3d time_conv{nullptr};  // null without upsampling in time
};

// A decoder stage: `resnets` (num_res_blocks + 1: in -> out, then out -> out), then `upsampler`
// (null in the last stage), plus, where it upsamples, the stage input copied up to the output's
// shape: each input channel repeated out * factor_t * 4 / in times, the copies laid out as
// (out channel, factor_t frames, 2 x 2 pixels); in the clip's first chunk only the last of the
// factor_t copies of frame 0 is kept (matching the undoubled frame 0 of the main path).
struct Wan22UpBlock : VaeBlock {
  Wan22UpBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool up, bool in_time,
               const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) override;
  torch::nn::ModuleList resnets{nullptr};
  std::shared_ptr<Wan22Upsample> upsampler;  // null in the last stage (then no shortcut either)
  int64_t out_channels, factor_t;
};

struct Wan22EncoderImpl : torch::nn::Module {
  Wan22EncoderImpl(const Wan22VAEConfig& cfg, const at::TensorOptions& options);
  // Patchified x [B, 12, T, H/2, W/2] -> [B, 2*z_dim, T', H/16, W/16]; cache as in causal_conv.h.
  at::Tensor forward(const at::Tensor& x, CausalCache* cache);
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};  // of Wan22DownBlock
  std::shared_ptr<Wan22MidBlock> mid_block;
  ChannelRMSNorm norm_out{nullptr};
};
TORCH_MODULE(Wan22Encoder);

struct Wan22DecoderImpl : torch::nn::Module {
  Wan22DecoderImpl(const Wan22VAEConfig& cfg, const at::TensorOptions& options);
  // z [B, z_dim, T', h, w] (after post_quant_conv) -> patchified [B, 12, 1 + 4(T'-1), 8h, 8w]
  at::Tensor forward(const at::Tensor& z, CausalCache* cache);
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  std::shared_ptr<Wan22MidBlock> mid_block;
  torch::nn::ModuleList up_blocks{nullptr};  // of Wan22UpBlock
  ChannelRMSNorm norm_out{nullptr};
};
TORCH_MODULE(Wan22Decoder);

// Parameter names and shapes equal diffusers' AutoencoderKLWan(is_residual=True) state dict
// (encoder.*, quant_conv.*, post_quant_conv.*, decoder.*). Thread-compatible (one run at a time per
// instance). Gradients flow through every method; wrap calls in torch::NoGradGuard when only
// caching latents.
struct Wan22VAEImpl : torch::nn::Module {
  // Builds with PyTorch-default random weights on `options`' device and dtype (at::kMeta lists
  // parameters without memory). Throws vidit::Error on a bad config.
  explicit Wan22VAEImpl(const Wan22VAEConfig& cfg = {}, const at::TensorOptions& options = {});

  // Tiling (opts.tiling, diffusers' enable_tiling values: tile and stride multiples of 16): the
  // encoder tiles the patchified video by them (patch_size times as many pixels), the decoder
  // tiles the latents by tile / 16 and blends in the patchified output: diffusers' tiles and blend.
  // video [B, 3, T, H, W], T = 1 + 4k, H and W multiples of 16 -> the posterior's mean and logvar
  // [B, z_dim, 1 + k, H/16, W/16] (logvar clamped to [-30, 20] as diffusers' posterior does).
  // Throws vidit::Error on any other shape.
  VaeMoments encode(const at::Tensor& video, const VaeRunOptions& opts = {});
  // Raw latents z [B, z_dim, T', h, w] -> video [B, 3, 1 + 4(T'-1), 16h, 16w] clamped to [-1, 1]
  // (diffusers' decode); decode_raw: the same before the clamp.
  at::Tensor decode(const at::Tensor& z, const VaeRunOptions& opts = {});
  at::Tensor decode_raw(const at::Tensor& z, const VaeRunOptions& opts = {});

  // What the DiT trains on: (mean - latent_mean) / latent_std of encode(video).
  at::Tensor encode_latents(const at::Tensor& video, const VaeRunOptions& opts = {});
  // Inverse of the above, then decode (clamped).
  at::Tensor decode_latents(const at::Tensor& latents, const VaeRunOptions& opts = {});

  // (mu - mean) * (1 / std) and z * std + mean, per channel (dim 1); identity without statistics.
  at::Tensor normalize_latents(const at::Tensor& mu) const;
  at::Tensor denormalize_latents(const at::Tensor& latents) const;

  Wan22VAEConfig cfg;
  Wan22Encoder encoder{nullptr};
  CausalConv3d quant_conv{nullptr}, post_quant_conv{nullptr};  // 1x1x1: 2*z_dim -> 2*z_dim, z_dim -> z_dim
  Wan22Decoder decoder{nullptr};

 private:
  at::Tensor encode_untiled(const at::Tensor& video, bool chunked);  // [B, 2*z_dim, ...]
  at::Tensor decode_untiled(const at::Tensor& z, bool chunked);      // unclamped RGB
  at::Tensor decode_patchified(const at::Tensor& z, bool chunked);   // the same before unpatchify
};
TORCH_MODULE(Wan22VAE);

// x [B, C, T, H, W] -> [B, C*p*p, T, H/p, W/p], channel c*p*p + (column offset)*p + (row offset),
// the order diffusers' patchify uses; unpatchify is its inverse. H, W must be multiples of p.
at::Tensor wan22_patchify(const at::Tensor& x, int64_t p);
at::Tensor wan22_unpatchify(const at::Tensor& x, int64_t p);

// Our config from a diffusers AutoencoderKLWan config.json of a Wan 2.2 VAE. Keys left out take
// AutoencoderKLWan's defaults (Wan 2.1's), so a file without is_residual or patch_size is refused.
// Throws vidit::Error naming the file and key for: another _class_name, is_residual not true (the
// Wan 2.1 VAE: open_wan_vae reads it), patch_size absent or not 2, in/out channels other than
// 3 * patch_size^2, non-empty attn_scales, stated scale factors that disagree with the stages,
// latents statistics whose length is not z_dim, an unknown key with a value, a value of the wrong type.
// `dropout` (no parameters, no effect in eval) and `clip_output` (dropped by diffusers, which now
// always clamps) are accepted and ignored.
Wan22VAEConfig wan22_vae_config_from_diffusers(const std::string& config_json);

// A Wan22VAE of the shape `path`'s config.json states, loaded strictly by name from its weights,
// on `options`' device and dtype, in eval mode. `path`: a diffusers vae/ folder (config.json +
// diffusion_pytorch_model.safetensors), a pipeline folder holding one, or the .safetensors file
// beside its config.json (vae_layout.h's find_vae_files). Throws vidit::Error naming the file and
// the field or keys at fault: no config.json, a config refused above, weights whose names or
// shapes differ from that config's.
Wan22VAE open_wan22_vae(const std::string& path, const at::TensorOptions& options = {});

// Whether the VAE at `path` (any form open_wan22_vae takes) is the Wan 2.2 VAE: its diffusers
// config.json says is_residual. False for the Wan 2.1 VAE, an official file without a config, and
// a path where no VAE is found.
bool is_wan22_vae(const std::string& path);

}  // namespace vidit
