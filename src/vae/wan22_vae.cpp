#include "vae/wan22_vae.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "model/state_dict.h"
#include "vae/tiling.h"
#include "vae/vae_layout.h"

namespace vidit {

using nlohmann::json;

// ---- config --------------------------------------------------------------------------------------

int64_t Wan22VAEConfig::patch_channels() const { return 3 * patch_size * patch_size; }

int64_t Wan22VAEConfig::spatial_factor() const { return patch_size << temporal_downsample.size(); }

int64_t Wan22VAEConfig::temporal_factor() const {
  return int64_t{1} << std::count(temporal_downsample.begin(), temporal_downsample.end(), true);
}

void Wan22VAEConfig::validate() const {
  VIDIT_CHECK(base_dim > 0, "vae.base_dim must be > 0, got ", base_dim);
  VIDIT_CHECK(decoder_base_dim > 0, "vae.decoder_base_dim must be > 0, got ", decoder_base_dim);
  VIDIT_CHECK(z_dim > 0, "vae.z_dim must be > 0, got ", z_dim);
  VIDIT_CHECK(!dim_mult.empty(), "vae.dim_mult must have at least one stage");
  for (int64_t m : dim_mult) VIDIT_CHECK(m > 0, "vae.dim_mult entries must be > 0, got ", m);
  // Without residual blocks an encoder stage's downsampler would see the stage's input width.
  VIDIT_CHECK(num_res_blocks >= 1, "vae.num_res_blocks must be >= 1, got ", num_res_blocks);
  VIDIT_CHECK(temporal_downsample.size() + 1 == dim_mult.size(), "vae.temporal_downsample needs ",
              dim_mult.size() - 1, " entries (one per downsampling), got ", temporal_downsample.size());
  VIDIT_CHECK(patch_size >= 1, "vae.patch_size must be >= 1, got ", patch_size);
  VIDIT_CHECK(latent_mean.size() == latent_std.size() &&
                  (latent_mean.empty() || int64_t(latent_mean.size()) == z_dim),
              "vae.latent_mean / latent_std need z_dim = ", z_dim, " entries each (or none), got ",
              latent_mean.size(), " and ", latent_std.size());
  for (float s : latent_std) VIDIT_CHECK(s > 0, "vae.latent_std entries must be > 0, got ", s);
}

// ---- layout helpers ------------------------------------------------------------------------------

at::Tensor wan22_patchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
  VIDIT_CHECK(H % p == 0 && W % p == 0, "patchify: frames of ", H, "x", W, " are not multiples of ", p);
  // [B, C, T, H/p, p(row), W/p, p(col)] -> [B, C, p(col), p(row), T, H/p, W/p]
  return x.reshape({B, C, T, H / p, p, W / p, p})
      .permute({0, 1, 6, 4, 2, 3, 5})
      .reshape({B, C * p * p, T, H / p, W / p});
}

at::Tensor wan22_unpatchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t B = x.size(0), C = x.size(1) / (p * p), T = x.size(2), H = x.size(3), W = x.size(4);
  // [B, C, p(col), p(row), T, H, W] -> [B, C, T, H, p(row), W, p(col)]
  return x.reshape({B, C, p, p, T, H, W}).permute({0, 1, 4, 5, 3, 6, 2}).reshape({B, C, T, H * p, W * p});
}

namespace {

// Runs a 2D layer on every frame: [B, C, T, H, W] -> [B*T, C, H, W] -> fn -> [B, C', T, H', W'].
template <typename Fn>
at::Tensor each_frame(const at::Tensor& x, Fn&& fn) {
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2);
  at::Tensor y = fn(x.permute({0, 2, 1, 3, 4}).reshape({B * T, C, x.size(3), x.size(4)}));
  return y.reshape({B, T, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
}

at::Tensor run_blocks(torch::nn::ModuleList& blocks, at::Tensor x, CausalCache* cache) {
  for (const auto& m : *blocks) x = m->as<VaeBlock>()->forward(x, cache);
  return x;
}

// The encoder stages' shortcut (wan22_vae.h, Wan22DownBlock): x [B, C, T, H, W] ->
// [B, out, ceil(T / ft), H / fs, W / fs].
at::Tensor average_down(const at::Tensor& x, int64_t out, int64_t ft, int64_t fs) {
  const int64_t C = x.size(1);
  if (ft == 1 && fs == 1 && C == out) return x;
  const int64_t pad_t = (ft - x.size(2) % ft) % ft;
  const at::Tensor padded = pad_t > 0 ? at::constant_pad_nd(x, {0, 0, 0, 0, pad_t, 0}) : x;
  const int64_t B = padded.size(0), T = padded.size(2), H = padded.size(3), W = padded.size(4);
  const int64_t group = C * ft * fs * fs / out;
  // [B, C, T/ft, ft, H/fs, fs, W/fs, fs] -> [B, C, ft, fs(row), fs(col), T/ft, H/fs, W/fs]
  return padded.reshape({B, C, T / ft, ft, H / fs, fs, W / fs, fs})
      .permute({0, 1, 3, 5, 7, 2, 4, 6})
      .reshape({B, out, group, T / ft, H / fs, W / fs})
      .mean(2);
}

// The decoder stages' shortcut (Wan22UpBlock): x [B, C, T, H, W] -> [B, out, T * ft, 2H, 2W], the
// first ft - 1 frames dropped in the clip's first chunk.
at::Tensor copy_up(const at::Tensor& x, int64_t out, int64_t ft, bool first_chunk) {
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
  const int64_t fs = 2, repeats = out * ft * fs * fs / C;
  // [B, out, ft, fs(row), fs(col), T, H, W] -> [B, out, T, ft, H, fs(row), W, fs(col)]
  at::Tensor y = x.repeat_interleave(repeats, 1)
                     .reshape({B, out, ft, fs, fs, T, H, W})
                     .permute({0, 1, 5, 2, 6, 3, 7, 4})
                     .reshape({B, out, T * ft, H * fs, W * fs});
  return first_chunk ? y.slice(2, ft - 1) : y;
}

}  // namespace

// ---- blocks --------------------------------------------------------------------------------------

Wan22ResidualBlock::Wan22ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options) {
  norm1 = register_module("norm1", ChannelRMSNorm(in, true, options));
  conv1 = register_module("conv1", CausalConv3d(in, out, 3, 3, /*time_pad=*/2, 1, options));
  norm2 = register_module("norm2", ChannelRMSNorm(out, true, options));
  conv2 = register_module("conv2", CausalConv3d(out, out, 3, 3, /*time_pad=*/2, 1, options));
  if (in != out) conv_shortcut = register_module("conv_shortcut", CausalConv3d(in, out, 1, 1, 0, 1, options));
}

at::Tensor Wan22ResidualBlock::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = conv_shortcut ? conv_shortcut->forward(x) : x;
  at::Tensor y = conv1->forward(at::silu(norm1->forward(x)), cache);
  y = conv2->forward(at::silu(norm2->forward(y)), cache);
  return y + h;
}

Wan22MidBlock::Wan22MidBlock(int64_t channels, const at::TensorOptions& options) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(std::make_shared<Wan22ResidualBlock>(channels, channels, options));
  attentions->push_back(std::make_shared<AttentionBlock>(channels, options));
  resnets->push_back(std::make_shared<Wan22ResidualBlock>(channels, channels, options));
}

at::Tensor Wan22MidBlock::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = resnets->ptr(0)->as<VaeBlock>()->forward(x, cache);
  h = attentions->ptr(0)->as<VaeBlock>()->forward(h, cache);
  return resnets->ptr(1)->as<VaeBlock>()->forward(h, cache);
}

Wan22DownBlock::Wan22DownBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool down, bool in_time,
                               const at::TensorOptions& options)
    : out_channels(out), factor_t(down && in_time ? 2 : 1), factor_s(down ? 2 : 1) {
  VIDIT_CHECK(in * factor_t * factor_s * factor_s % out == 0, "Wan 2.2 VAE encoder stage ", in, " -> ", out,
              " channels: the averaged shortcut needs ", in, " x ", factor_t * factor_s * factor_s,
              " to be a multiple of ", out, " (check vae.base_dim / vae.dim_mult)");
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t r = 0; r < num_res_blocks; ++r)
    resnets->push_back(std::make_shared<Wan22ResidualBlock>(r == 0 ? in : out, out, options));
  if (down)
    downsampler = register_module(
        "downsampler", std::make_shared<Resample>(out, in_time ? ResampleMode::Down3d : ResampleMode::Down2d, options));
}

at::Tensor Wan22DownBlock::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = run_blocks(resnets, x, cache);
  if (downsampler) h = downsampler->forward(h, cache);
  return h + average_down(x, out_channels, factor_t, factor_s);
}

Wan22Upsample::Wan22Upsample(int64_t channels, bool in_time, const at::TensorOptions& options) {
  conv = VaeConv2d(channels, channels, 3, 1, 1, options);
  register_indexed(*this, "resample", {{"1", conv.ptr()}});
  if (in_time)
    time_conv = register_module("time_conv", CausalConv3d(channels, 2 * channels, 3, 1, /*time_pad=*/2, 1, options));
}

at::Tensor Wan22Upsample::forward(const at::Tensor& x_in, CausalCache* cache) {
  at::Tensor x = x_in;
  if (time_conv) {
    // Frame 0 of the clip is not doubled; every later frame becomes two (the first half of the
    // time_conv's channels first). In a chunked run frame 0 is the whole first chunk, so this
    // layer's causal conv first runs on the second chunk, with zeros in front, as diffusers' does.
    const bool first_chunk = cache == nullptr || cache->first_chunk;
    at::Tensor rest = first_chunk ? x.slice(2, 1) : x;
    if (rest.size(2) > 0) {
      const int64_t B = rest.size(0), C = rest.size(1), T = rest.size(2), H = rest.size(3), W = rest.size(4);
      rest = time_conv->forward(rest, cache)
                 .reshape({B, 2, C, T, H, W})
                 .permute({0, 2, 3, 1, 4, 5})
                 .reshape({B, C, 2 * T, H, W});  // t0a t0b t1a t1b ...
    }
    x = !first_chunk ? rest : rest.size(2) > 0 ? at::cat({x.slice(2, 0, 1), rest}, 2) : x.slice(2, 0, 1);
  }
  // Nearest x2 (for an exact factor of 2 the same as diffusers' 'nearest-exact'), then the conv.
  return each_frame(x, [&](const at::Tensor& f) {
    return conv->forward(at::upsample_nearest2d(f, {2 * f.size(2), 2 * f.size(3)}));
  });
}

Wan22UpBlock::Wan22UpBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool up, bool in_time,
                           const at::TensorOptions& options)
    : out_channels(out), factor_t(up && in_time ? 2 : 1) {
  VIDIT_CHECK(!up || out * factor_t * 4 % in == 0, "Wan 2.2 VAE decoder stage ", in, " -> ", out,
              " channels: the copied shortcut needs ", out, " x ", factor_t * 4, " to be a multiple of ", in,
              " (check vae.decoder_base_dim / vae.dim_mult)");
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t r = 0; r < num_res_blocks + 1; ++r)
    resnets->push_back(std::make_shared<Wan22ResidualBlock>(r == 0 ? in : out, out, options));
  if (up) upsampler = register_module("upsampler", std::make_shared<Wan22Upsample>(out, in_time, options));
}

at::Tensor Wan22UpBlock::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = run_blocks(resnets, x, cache);
  if (!upsampler) return h;
  h = upsampler->forward(h, cache);
  const bool first_chunk = cache == nullptr || cache->first_chunk;
  return h + copy_up(x, out_channels, factor_t, first_chunk);
}

// ---- encoder, decoder ----------------------------------------------------------------------------

Wan22EncoderImpl::Wan22EncoderImpl(const Wan22VAEConfig& cfg, const at::TensorOptions& options) {
  const int64_t stages = int64_t(cfg.dim_mult.size());
  conv_in = register_module("conv_in", CausalConv3d(cfg.patch_channels(), cfg.base_dim, 3, 3, 2, 1, options));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  int64_t dim = cfg.base_dim;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = cfg.base_dim * cfg.dim_mult[s];
    const bool down = s + 1 < stages;
    down_blocks->push_back(std::make_shared<Wan22DownBlock>(dim, out, cfg.num_res_blocks, down,
                                                            down && cfg.temporal_downsample[s], options));
    dim = out;
  }
  mid_block = register_module("mid_block", std::make_shared<Wan22MidBlock>(dim, options));
  norm_out = register_module("norm_out", ChannelRMSNorm(dim, true, options));
  conv_out = register_module("conv_out", CausalConv3d(dim, 2 * cfg.z_dim, 3, 3, 2, 1, options));
}

at::Tensor Wan22EncoderImpl::forward(const at::Tensor& x, CausalCache* cache) {
  at::Tensor h = conv_in->forward(x, cache);
  h = run_blocks(down_blocks, h, cache);
  h = mid_block->forward(h, cache);
  return conv_out->forward(at::silu(norm_out->forward(h)), cache);
}

Wan22DecoderImpl::Wan22DecoderImpl(const Wan22VAEConfig& cfg, const at::TensorOptions& options) {
  const int64_t stages = int64_t(cfg.dim_mult.size());
  int64_t dim = cfg.decoder_base_dim * cfg.dim_mult.back();
  conv_in = register_module("conv_in", CausalConv3d(cfg.z_dim, dim, 3, 3, 2, 1, options));
  mid_block = register_module("mid_block", std::make_shared<Wan22MidBlock>(dim, options));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  // Stage widths run the encoder's multipliers in reverse; the upsamplers keep the width.
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = cfg.decoder_base_dim * cfg.dim_mult[stages - 1 - s];
    const bool up = s + 1 < stages;
    const bool in_time = up && cfg.temporal_downsample[stages - 2 - s];
    up_blocks->push_back(std::make_shared<Wan22UpBlock>(dim, out, cfg.num_res_blocks, up, in_time, options));
    dim = out;
  }
  norm_out = register_module("norm_out", ChannelRMSNorm(dim, true, options));
  conv_out = register_module("conv_out", CausalConv3d(dim, cfg.patch_channels(), 3, 3, 2, 1, options));
}

at::Tensor Wan22DecoderImpl::forward(const at::Tensor& z, CausalCache* cache) {
  at::Tensor h = conv_in->forward(z, cache);
  h = mid_block->forward(h, cache);
  h = run_blocks(up_blocks, h, cache);
  return conv_out->forward(at::silu(norm_out->forward(h)), cache);
}

// ---- the VAE -------------------------------------------------------------------------------------

Wan22VAEImpl::Wan22VAEImpl(const Wan22VAEConfig& cfg_, const at::TensorOptions& options) : cfg(cfg_) {
  cfg.validate();
  encoder = register_module("encoder", Wan22Encoder(cfg, options));
  quant_conv = register_module("quant_conv", CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 0, 1, options));
  post_quant_conv = register_module("post_quant_conv", CausalConv3d(cfg.z_dim, cfg.z_dim, 1, 1, 0, 1, options));
  decoder = register_module("decoder", Wan22Decoder(cfg, options));
}

at::Tensor Wan22VAEImpl::encode_untiled(const at::Tensor& video, bool chunked) {
  const at::Tensor x = wan22_patchify(video, cfg.patch_size);
  if (!chunked) return quant_conv->forward(encoder->forward(x, nullptr));
  // Frame 0 alone, then chunks of temporal_factor() frames (4), each one latent frame.
  const int64_t T = x.size(2), chunk = cfg.temporal_factor();
  CausalCache cache;
  std::vector<at::Tensor> out;
  for (int64_t begin = 0; begin < T;) {
    const int64_t end = begin == 0 ? 1 : begin + chunk;
    out.push_back(encoder->forward(x.slice(2, begin, end), &cache));
    cache.first_chunk = false;
    begin = end;
  }
  return quant_conv->forward(at::cat(out, 2));
}

VaeMoments Wan22VAEImpl::encode(const at::Tensor& video, const VaeRunOptions& opts) {
  const int64_t tf = cfg.temporal_factor(), sf = cfg.spatial_factor();
  VIDIT_CHECK(video.dim() == 5 && video.size(1) == 3 && video.size(2) % tf == 1 % tf && video.size(3) > 0 &&
                  video.size(4) > 0 && video.size(3) % sf == 0 && video.size(4) % sf == 0,
              "Wan 2.2 VAE encode: video must be [B, 3, T, H, W] with T = 1 + ", tf, "k frames and H, W multiples of ",
              sf, ", got ", video.sizes(), ": trim the clip to 1 + ", tf, "k frames and crop/resize the frames");
  at::Tensor moments;
  const VaeTiling& t = opts.tiling;
  if (t.enabled && (video.size(3) > t.tile || video.size(4) > t.tile)) {
    VIDIT_CHECK(t.tile % sf == 0 && t.stride % sf == 0, "VAE tiling: tile (", t.tile, ") and stride (", t.stride,
                ") must be multiples of ", sf, " pixels for the Wan 2.2 VAE");
    // diffusers tiles the patchified video by tile and stride (patch_size times as many pixels)
    // and blends the latents over (tile - stride) / (16 / patch_size) of them.
    const int64_t p = cfg.patch_size, r = sf / p;
    moments = blend_tiles_as_diffusers(video, p * t.tile, p * t.stride, t.stride / r, t.tile / r - t.stride / r,
                                       video.size(3) / sf, video.size(4) / sf,
                                       [&](const at::Tensor& tile) { return encode_untiled(tile, opts.chunked); });
  } else {
    moments = encode_untiled(video, opts.chunked);
  }
  auto parts = moments.chunk(2, 1);
  return {parts[0], parts[1].clamp(-30.0, 20.0)};
}

at::Tensor Wan22VAEImpl::decode_untiled(const at::Tensor& z, bool chunked) {
  return wan22_unpatchify(decode_patchified(z, chunked), cfg.patch_size);
}

at::Tensor Wan22VAEImpl::decode_patchified(const at::Tensor& z, bool chunked) {
  const at::Tensor x = post_quant_conv->forward(z);
  at::Tensor out;
  if (!chunked) {
    out = decoder->forward(x, nullptr);
  } else {
    // One latent frame at a time; the first is the clip's first chunk.
    CausalCache cache;
    std::vector<at::Tensor> frames;
    for (int64_t t = 0; t < x.size(2); ++t) {
      frames.push_back(decoder->forward(x.slice(2, t, t + 1), &cache));
      cache.first_chunk = false;
    }
    out = at::cat(frames, 2);
  }
  return out;
}

at::Tensor Wan22VAEImpl::decode_raw(const at::Tensor& z, const VaeRunOptions& opts) {
  VIDIT_CHECK(z.dim() == 5 && z.size(1) == cfg.z_dim && z.size(2) > 0 && z.size(3) > 0 && z.size(4) > 0,
              "Wan 2.2 VAE decode: latents must be [B, ", cfg.z_dim, ", T, h, w], got ", z.sizes());
  const int64_t sf = cfg.spatial_factor();
  const VaeTiling& t = opts.tiling;
  if (t.enabled && (z.size(3) * sf > t.tile || z.size(4) * sf > t.tile)) {
    VIDIT_CHECK(t.tile % sf == 0 && t.stride % sf == 0, "VAE tiling: tile (", t.tile, ") and stride (", t.stride,
                ") must be multiples of ", sf, " pixels for the Wan 2.2 VAE");
    // Latent tiles of tile / 16, blended in the patchified output over (tile - stride) / patch_size
    // of its pixels, as diffusers blends, then unpatchified whole. (opts.share is not used: every
    // process that decodes computes all tiles.)
    const int64_t p = cfg.patch_size, r = sf / p;
    return wan22_unpatchify(
        blend_tiles_as_diffusers(z, t.tile / sf, t.stride / sf, t.stride / p, t.tile / p - t.stride / p, z.size(3) * r,
                                 z.size(4) * r,
                                 [&](const at::Tensor& tile) { return decode_patchified(tile, opts.chunked); }),
        p);
  }
  return decode_untiled(z, opts.chunked);
}

at::Tensor Wan22VAEImpl::decode(const at::Tensor& z, const VaeRunOptions& opts) {
  return decode_raw(z, opts).clamp(-1, 1);
}

at::Tensor Wan22VAEImpl::normalize_latents(const at::Tensor& mu) const {
  if (cfg.latent_mean.empty()) return mu;
  const auto opts = mu.options();
  const at::Tensor mean = at::tensor(cfg.latent_mean, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor inv_std = (1.0 / at::tensor(cfg.latent_std, at::kFloat)).to(opts).view({1, -1, 1, 1, 1});
  return (mu - mean) * inv_std;
}

at::Tensor Wan22VAEImpl::denormalize_latents(const at::Tensor& latents) const {
  if (cfg.latent_mean.empty()) return latents;
  const auto opts = latents.options();
  const at::Tensor mean = at::tensor(cfg.latent_mean, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor std = at::tensor(cfg.latent_std, at::kFloat).to(opts).view({1, -1, 1, 1, 1});
  return latents * std + mean;
}

at::Tensor Wan22VAEImpl::encode_latents(const at::Tensor& video, const VaeRunOptions& opts) {
  return normalize_latents(encode(video, opts).mean);
}

at::Tensor Wan22VAEImpl::decode_latents(const at::Tensor& latents, const VaeRunOptions& opts) {
  return decode(denormalize_latents(latents), opts);
}

// ---- reading diffusers' folder -------------------------------------------------------------------

namespace {


bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

int64_t int_of(const json& j, const char* key, int64_t def, const std::string& path) {
  if (!present(j, key)) return def;
  VIDIT_CHECK(j[key].is_number_integer(), "VAE config '", path, "': '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

template <typename T, typename Ok>
std::vector<T> list_of(const json& j, const char* key, std::vector<T> def, const std::string& path, Ok ok,
                       const char* what) {
  if (!present(j, key)) return def;
  const json& v = j[key];
  bool good = v.is_array();
  for (size_t i = 0; good && i < v.size(); ++i) good = ok(v[i]);
  VIDIT_CHECK(good, "VAE config '", path, "': '", key, "' must be a list of ", what, ", got ", v.dump());
  std::vector<T> out;
  for (const json& e : v) out.push_back(e.get<T>());
  return out;
}

}  // namespace

Wan22VAEConfig wan22_vae_config_from_diffusers(const std::string& path) {
  const json j = read_vae_config_json(path);
  const std::string cls = !j.contains("_class_name")        ? std::string("(none)")
                          : j["_class_name"].is_string() ? j["_class_name"].get<std::string>()
                                                         : j["_class_name"].dump();
  VIDIT_CHECK(cls == "AutoencoderKLWan", "VAE config '", path, "' describes a model of class '", cls,
              "', not diffusers' AutoencoderKLWan (the Wan 2.2 VAE): give the pipeline's vae/ folder");
  static const std::set<std::string> known = {
      "base_dim",    "decoder_base_dim", "z_dim",       "dim_mult",    "num_res_blocks",        "attn_scales",
      "temperal_downsample", "dropout",  "latents_mean", "latents_std", "is_residual",          "in_channels",
      "out_channels", "patch_size",      "scale_factor_temporal",      "scale_factor_spatial",  "clip_output"};
  for (const auto& item : j.items()) {
    if (item.key().rfind("_", 0) == 0 || known.count(item.key()) || item.value().is_null()) continue;
    fail("VAE config '", path, "': key '", item.key(), "' (", item.value().dump(), ") is not an AutoencoderKLWan "
         "setting vidit knows, so the VAE it describes may have parts vidit's lacks; remove it if it is harmless");
  }
  // What AutoencoderKLWan takes for a key left out is Wan 2.1's; Wan 2.2's must be stated.
  VIDIT_CHECK(present(j, "is_residual") && j["is_residual"] == true, "VAE config '", path, "': is_residual is ",
              present(j, "is_residual") ? j["is_residual"].dump() : std::string("not set (false)"),
              ", which is the Wan 2.1 VAE; the Wan 2.2 VAE has is_residual true (open a Wan 2.1 VAE with open_wan_vae)");
  const int64_t patch = int_of(j, "patch_size", 0, path);
  VIDIT_CHECK(patch == 2, "VAE config '", path, "': patch_size is ",
              present(j, "patch_size") ? j["patch_size"].dump() : std::string("not set"),
              "; the Wan 2.2 VAE patchifies 2x2 (patch_size 2)");
  auto is_num = [](const json& e) { return e.is_number(); };
  const bool no_attention = list_of<double>(j, "attn_scales", {}, path, is_num, "numbers").empty();
  VIDIT_CHECK(no_attention, "VAE config '", path, "': attn_scales ", j.value("attn_scales", json()).dump(),
              " adds attention blocks to the stages; the Wan 2.2 VAE has none and vidit's neither");
  if (present(j, "dropout"))
    VIDIT_CHECK(j["dropout"].is_number(), "VAE config '", path, "': 'dropout' must be a number, got ", j["dropout"].dump());
  if (present(j, "clip_output"))
    VIDIT_CHECK(j["clip_output"].is_boolean(), "VAE config '", path, "': 'clip_output' must be true or false, got ",
                j["clip_output"].dump());

  auto is_int = [](const json& e) { return e.is_number_integer(); };
  auto is_bool = [](const json& e) { return e.is_boolean(); };
  Wan22VAEConfig c;
  c.patch_size = patch;
  // AutoencoderKLWan's own defaults where a key is left out.
  c.base_dim = int_of(j, "base_dim", 96, path);
  c.decoder_base_dim = int_of(j, "decoder_base_dim", c.base_dim, path);
  c.z_dim = int_of(j, "z_dim", 16, path);
  c.num_res_blocks = int_of(j, "num_res_blocks", 2, path);
  c.dim_mult = list_of<int64_t>(j, "dim_mult", {1, 2, 4, 4}, path, is_int, "integers");
  c.temporal_downsample = list_of<bool>(j, "temperal_downsample", {false, true, true}, path, is_bool, "booleans");
  const std::vector<float> wan21_mean(kWan21LatentMean.begin(), kWan21LatentMean.end());
  const std::vector<float> wan21_std(kWan21LatentStd.begin(), kWan21LatentStd.end());
  c.latent_mean = list_of<float>(j, "latents_mean", wan21_mean, path, is_num, "numbers");
  c.latent_std = list_of<float>(j, "latents_std", wan21_std, path, is_num, "numbers");
  VIDIT_CHECK(int64_t(c.latent_mean.size()) == c.z_dim && int64_t(c.latent_std.size()) == c.z_dim, "VAE config '",
              path, "': z_dim is ", c.z_dim, " but latents_mean has ", c.latent_mean.size(), " and latents_std ",
              c.latent_std.size(), " entries", present(j, "latents_mean") ? "" : " (left out: Wan 2.1's 16)",
              "; they must agree (the Wan 2.2 VAE: z_dim 48)");
  for (const char* key : {"in_channels", "out_channels"}) {
    const int64_t v = int_of(j, key, 3, path);
    VIDIT_CHECK(v == c.patch_channels(), "VAE config '", path, "': ", key, " is ", v, " but patch_size ", c.patch_size,
                " makes RGB video ", c.patch_channels(), " channels");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("VAE config '", path, "': ", e.what());
  }
  // Stated scale factors must be the stages' (they size diffusers' tiles and pipelines' latents).
  if (present(j, "scale_factor_temporal") || present(j, "scale_factor_spatial")) {
    const int64_t tf = int_of(j, "scale_factor_temporal", c.temporal_factor(), path);
    const int64_t sf = int_of(j, "scale_factor_spatial", c.spatial_factor(), path);
    VIDIT_CHECK(tf == c.temporal_factor() && sf == c.spatial_factor(), "VAE config '", path,
                "': scale_factor_temporal ", tf, " / scale_factor_spatial ", sf,
                " disagree with the stages (dim_mult, temperal_downsample, patch_size), which compress ",
                c.temporal_factor(), "x in time and ", c.spatial_factor(), "x in space");
  }
  return c;
}

bool is_wan22_vae(const std::string& path) {
  if (path.empty()) return false;
  VaeFiles files;
  try {
    files = find_vae_files(path);
  } catch (const Error&) {
    return false;  // no VAE there: whoever opens it names the problem
  }
  if (files.config.empty()) return false;
  std::ifstream in(files.config);
  const nlohmann::json c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return c.is_object() && c.value("is_residual", false) == true;
}

Wan22VAE open_wan22_vae(const std::string& path, const at::TensorOptions& options) {
  const VaeFiles files = find_vae_files(path);
  VIDIT_CHECK(!files.config.empty(), "Wan 2.2 VAE '", path, "': no diffusers config.json beside '", files.weights,
              "'; give diffusers' vae/ folder (config.json + diffusion_pytorch_model.safetensors)");
  const Wan22VAEConfig cfg = wan22_vae_config_from_diffusers(files.config);
  Wan22VAE vae(cfg, options);
  try {
    load_state_dict(*vae, load_safetensors(files.weights), files.weights);
  } catch (const Error& e) {
    fail(e.what(), "\n  (the Wan 2.2 VAE that '", files.config, "' describes: base_dim ", cfg.base_dim,
         ", decoder_base_dim ", cfg.decoder_base_dim, ", z_dim ", cfg.z_dim, ", ", cfg.dim_mult.size(), " stages, ",
         cfg.num_res_blocks, " residual blocks per stage, diffusers' AutoencoderKLWan names)");
  }
  vae->eval();
  return vae;
}

}  // namespace vidit
