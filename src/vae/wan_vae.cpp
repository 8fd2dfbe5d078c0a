#include "vae/wan_vae.h"

#include <sstream>

#include "core/error.h"
#include "model/state_dict.h"
#include "vae/tiling.h"
#include "vae/vae_layout.h"

namespace vidit {

int64_t WanVAEConfig::spatial_factor() const { return int64_t{1} << temporal_downsample.size(); }

int64_t WanVAEConfig::temporal_factor() const {
  return int64_t{1} << std::count(temporal_downsample.begin(), temporal_downsample.end(), true);
}

void WanVAEConfig::validate() const {
  VIDIT_CHECK(base_dim > 0 && base_dim % 2 == 0, "vae.base_dim must be a positive even number, got ", base_dim);
  VIDIT_CHECK(z_dim > 0, "vae.z_dim must be > 0, got ", z_dim);
  VIDIT_CHECK(!dim_mult.empty(), "vae.dim_mult must have at least one stage");
  for (int64_t m : dim_mult) VIDIT_CHECK(m > 0, "vae.dim_mult entries must be > 0, got ", m);
  VIDIT_CHECK(num_res_blocks >= 0, "vae.num_res_blocks must be >= 0, got ", num_res_blocks);
  VIDIT_CHECK(temporal_downsample.size() + 1 == dim_mult.size(), "vae.temporal_downsample needs ",
              dim_mult.size() - 1, " entries (one per downsampling), got ", temporal_downsample.size());
  VIDIT_CHECK(latent_mean.size() == latent_std.size() &&
                  (latent_mean.empty() || int64_t(latent_mean.size()) == z_dim),
              "vae.latent_mean / latent_std need z_dim = ", z_dim, " entries each (or none), got ",
              latent_mean.size(), " and ", latent_std.size());
  for (float s : latent_std) VIDIT_CHECK(s > 0, "vae.latent_std entries must be > 0, got ", s);
}

namespace {

at::Tensor run_blocks(torch::nn::ModuleList& blocks, at::Tensor x, CausalCache* cache) {
  for (const auto& m : *blocks) x = m->as<VaeBlock>()->forward(x, cache);
  return x;
}

}  // namespace

WanEncoderImpl::WanEncoderImpl(const WanVAEConfig& cfg, const at::TensorOptions& options) {
  const int64_t stages = int64_t(cfg.dim_mult.size());
  conv1 = register_module("conv1", CausalConv3d(3, cfg.base_dim, 3, 3, 2, 1, options));
  downsamples = register_module("downsamples", torch::nn::ModuleList());
  int64_t dim = cfg.base_dim;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = cfg.base_dim * cfg.dim_mult[s];
    for (int64_t r = 0; r < cfg.num_res_blocks; ++r) {
      downsamples->push_back(std::make_shared<ResidualBlock>(dim, out, options));
      dim = out;
    }
    if (s + 1 < stages) {
      const auto mode = cfg.temporal_downsample[s] ? ResampleMode::Down3d : ResampleMode::Down2d;
      downsamples->push_back(std::make_shared<Resample>(out, mode, options));
    }
  }
  // Official: the middle and head use the last stage's width even with num_res_blocks = 0.
  dim = cfg.base_dim * cfg.dim_mult.back();
  middle = register_module("middle", torch::nn::ModuleList());
  middle->push_back(std::make_shared<ResidualBlock>(dim, dim, options));
  middle->push_back(std::make_shared<AttentionBlock>(dim, options));
  middle->push_back(std::make_shared<ResidualBlock>(dim, dim, options));
  head_norm = ChannelRMSNorm(dim, true, options);
  head_conv = CausalConv3d(dim, 2 * cfg.z_dim, 3, 3, 2, 1, options);
  register_indexed(*this, "head", {{"0", head_norm.ptr()}, {"2", head_conv.ptr()}});
}

at::Tensor WanEncoderImpl::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = conv1->forward(x, cache);
  h = run_blocks(downsamples, h, cache);
  h = run_blocks(middle, h, cache);
  return head_conv->forward(at::silu(head_norm->forward(h)), cache);
}

WanDecoderImpl::WanDecoderImpl(const WanVAEConfig& cfg, const at::TensorOptions& options) {
  const int64_t stages = int64_t(cfg.dim_mult.size());
  const int64_t top = cfg.base_dim * cfg.dim_mult.back();
  conv1 = register_module("conv1", CausalConv3d(cfg.z_dim, top, 3, 3, 2, 1, options));
  middle = register_module("middle", torch::nn::ModuleList());
  middle->push_back(std::make_shared<ResidualBlock>(top, top, options));
  middle->push_back(std::make_shared<AttentionBlock>(top, options));
  middle->push_back(std::make_shared<ResidualBlock>(top, top, options));
  upsamples = register_module("upsamples", torch::nn::ModuleList());
  // Stage widths run the encoder's in reverse. Each upsampling Resample halves its channels, so
  // every stage after the first starts from half the previous stage's width.
  int64_t dim = top;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = cfg.base_dim * cfg.dim_mult[stages - 1 - s];
    for (int64_t r = 0; r < cfg.num_res_blocks + 1; ++r) {
      upsamples->push_back(std::make_shared<ResidualBlock>(dim, out, options));
      dim = out;
    }
    if (s + 1 < stages) {
      const bool in_time = cfg.temporal_downsample[stages - 2 - s];
      upsamples->push_back(std::make_shared<Resample>(out, in_time ? ResampleMode::Up3d : ResampleMode::Up2d, options));
      dim = out / 2;
    }
  }
  head_norm = ChannelRMSNorm(dim, true, options);
  head_conv = CausalConv3d(dim, 3, 3, 3, 2, 1, options);
  register_indexed(*this, "head", {{"0", head_norm.ptr()}, {"2", head_conv.ptr()}});
}

at::Tensor WanDecoderImpl::forward(const at::Tensor& z, CausalCache* cache) {
  at::Tensor h = conv1->forward(z, cache);
  h = run_blocks(middle, h, cache);
  h = run_blocks(upsamples, h, cache);
  return head_conv->forward(at::silu(head_norm->forward(h)), cache);
}

WanVAEImpl::WanVAEImpl(const WanVAEConfig& cfg_, const at::TensorOptions& options) : cfg(cfg_) {
  cfg.validate();
  encoder = register_module("encoder", WanEncoder(cfg, options));
  conv1 = register_module("conv1", CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 0, 1, options));
  conv2 = register_module("conv2", CausalConv3d(cfg.z_dim, cfg.z_dim, 1, 1, 0, 1, options));
  decoder = register_module("decoder", WanDecoder(cfg, options));
}

at::Tensor WanVAEImpl::encode_untiled(const at::Tensor& video, bool chunked) {
  if (!chunked) return conv1->forward(encoder->forward(video, nullptr));
  // Frame 0 alone, then chunks of temporal_factor() frames (4), each one latent frame.
  const int64_t T = video.size(2), chunk = cfg.temporal_factor();
  CausalCache cache;
  std::vector<at::Tensor> out;
  for (int64_t begin = 0; begin < T;) {
    const int64_t end = begin == 0 ? 1 : begin + chunk;
    out.push_back(encoder->forward(video.slice(2, begin, end), &cache));
    cache.first_chunk = false;
    begin = end;
  }
  return conv1->forward(at::cat(out, 2));
}

VaeMoments WanVAEImpl::encode(const at::Tensor& video, const VaeRunOptions& opts) {
  const int64_t tf = cfg.temporal_factor(), sf = cfg.spatial_factor();
  VIDIT_CHECK(video.dim() == 5 && video.size(1) == 3 && video.size(2) % tf == 1 % tf &&
                  video.size(3) % sf == 0 && video.size(4) % sf == 0 && video.size(3) > 0 && video.size(4) > 0,
              "VAE encode: video must be [B, 3, T, H, W] with T = 1 + ", tf, "k frames and H, W multiples of ",
              sf, ", got ", video.sizes(), ": trim the clip to 1 + ", tf, "k frames and crop/resize the frames");
  at::Tensor moments;
  const VaeTiling& t = opts.tiling;
  if (t.enabled && (video.size(3) > t.tile || video.size(4) > t.tile)) {
    VIDIT_CHECK(t.tile % sf == 0 && t.stride % sf == 0, "VAE tiling: tile (", t.tile, ") and stride (", t.stride,
                ") must be multiples of ", sf, " pixels");
    moments = tiled_apply(video, t.tile, t.stride, 1, sf,
                          [&](const at::Tensor& tile) { return encode_untiled(tile, opts.chunked); });
  } else {
    moments = encode_untiled(video, opts.chunked);
  }
  auto parts = moments.chunk(2, 1);
  return {parts[0], parts[1]};
}

at::Tensor WanVAEImpl::decode_untiled(const at::Tensor& z, bool chunked) {
  at::Tensor x = conv2->forward(z);
  if (!chunked) return decoder->forward(x, nullptr);
  // One latent frame at a time.
  CausalCache cache;
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < x.size(2); ++t) {
    out.push_back(decoder->forward(x.slice(2, t, t + 1), &cache));
    cache.first_chunk = false;
  }
  return at::cat(out, 2);
}

at::Tensor WanVAEImpl::decode(const at::Tensor& z, const VaeRunOptions& opts) {
  VIDIT_CHECK(z.dim() == 5 && z.size(1) == cfg.z_dim && z.size(2) > 0 && z.size(3) > 0 && z.size(4) > 0,
              "VAE decode: latents must be [B, ", cfg.z_dim, ", T, h, w], got ", z.sizes());
  const int64_t sf = cfg.spatial_factor();
  const VaeTiling& t = opts.tiling;
  if (t.enabled && (z.size(3) * sf > t.tile || z.size(4) * sf > t.tile)) {
    VIDIT_CHECK(t.tile % sf == 0 && t.stride % sf == 0, "VAE tiling: tile (", t.tile, ") and stride (", t.stride,
                ") must be multiples of ", sf, " pixels");
    return tiled_apply(z, t.tile / sf, t.stride / sf, sf, 1,
                       [&](const at::Tensor& tile) { return decode_untiled(tile, opts.chunked); }, opts.share);
  }
  return decode_untiled(z, opts.chunked);
}

at::Tensor WanVAEImpl::normalize_latents(const at::Tensor& mu) const {
  if (cfg.latent_mean.empty()) return mu;
  auto opts = mu.options();
  at::Tensor mean = at::tensor(cfg.latent_mean, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  at::Tensor inv_std = (1.0 / at::tensor(cfg.latent_std, at::kFloat)).to(opts).view({1, -1, 1, 1, 1});
  return (mu - mean) * inv_std;  // the official code multiplies by 1/std
}

at::Tensor WanVAEImpl::denormalize_latents(const at::Tensor& latents) const {
  if (cfg.latent_mean.empty()) return latents;
  auto opts = latents.options();
  at::Tensor mean = at::tensor(cfg.latent_mean, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  at::Tensor std = at::tensor(cfg.latent_std, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  return latents * std + mean;
}

at::Tensor WanVAEImpl::encode_latents(const at::Tensor& video, const VaeRunOptions& opts) {
  return normalize_latents(encode(video, opts).mean);
}

at::Tensor WanVAEImpl::decode_latents(const at::Tensor& latents, const VaeRunOptions& opts) {
  return decode(denormalize_latents(latents), opts).clamp(-1, 1);
}

void load_wan_vae(WanVAEImpl& vae, const TensorMap& tensors, const std::string& source) {
  if (vae_layout_of(tensors, source) == VaeLayout::diffusers) {  // renamed strictly, in diffusers' names
    load_state_dict(vae, vae_to_official_names(tensors, vae.cfg, source), source);
    return;
  }
  try {
    load_state_dict(vae, tensors, source);
  } catch (const Error& e) {
    fail(e.what(), "\n  (the Wan 2.1 VAE expects the official keys encoder.*, conv1.*, conv2.*, decoder.* or diffusers' "
         "AutoencoderKLWan keys, of a config with base_dim ", vae.cfg.base_dim, ", z_dim ", vae.cfg.z_dim, ", ",
         vae.cfg.dim_mult.size(), " stages, ", vae.cfg.num_res_blocks, " residual blocks per stage)");
  }
}

void load_wan_vae(WanVAEImpl& vae, const std::string& path) {
  const VaeFiles files = find_vae_files(path);
  if (!files.config.empty()) check_vae_config(vae_config_from_diffusers(files.config), vae.cfg, files.config);
  load_wan_vae(vae, load_safetensors(files.weights), files.weights);
}

WanVAE open_wan_vae(const std::string& path, const at::TensorOptions& options) {
  const VaeFiles files = find_vae_files(path);
  WanVAE vae(files.config.empty() ? WanVAEConfig{} : vae_config_from_diffusers(files.config), options);
  load_wan_vae(*vae, load_safetensors(files.weights), files.weights);
  vae->eval();
  return vae;
}

}  // namespace vidit
