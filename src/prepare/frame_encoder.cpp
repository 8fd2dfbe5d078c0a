#include "prepare/frame_encoder.h"

#include <torch/cuda.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "prepare/caption_embedder.h"
#include "prepare/demo_codec.h"
#include "vae/wan_vae.h"

namespace vidit {

namespace {

// The encoder data.codec names.
FrameEncoder codec_encoder(const Config& cfg) {
  if (cfg.data.codec == Codec::demo) {
    const int64_t block = cfg.demo.codec_block;
    return [block](const at::Tensor& frames, const ClipRef&) {
      at::Tensor mean = demo::codec_encode(frames, block);
      return std::make_pair(mean, at::zeros_like(mean));  // lossless: no spread
    };
  }
  VIDIT_CHECK(!cfg.data.vae_weights.empty(), cfg.source, ": data.codec = \"wan_vae\" needs data.vae_weights "
              "(the Wan 2.1 VAE as .safetensors)");
  const bool has_cuda = torch::cuda::is_available();
  VIDIT_CHECK(cfg.data.encode_device != DeviceChoice::cuda || has_cuda, cfg.source, ": data.encode_device = \"cuda\" but no CUDA "
              "device is visible to this build; use \"auto\" or \"cpu\"");
  const at::Device device = cfg.data.encode_device == DeviceChoice::cpu || !has_cuda ? at::Device(at::kCPU) : at::Device(at::kCUDA);
  auto vae = std::make_shared<WanVAE>(WanVAEConfig{});
  load_wan_vae(**vae, cfg.data.vae_weights);
  (*vae)->eval();
  (*vae)->to(device);
  return [vae, device](const at::Tensor& frames, const ClipRef&) {
    at::NoGradGuard no_grad;
    at::Tensor video = frames.to(device).permute({3, 0, 1, 2}).unsqueeze(0).to(at::kFloat).div(127.5).sub(1.0);
    VaeRunOptions opt;
    opt.tiling.enabled = video.size(3) > opt.tiling.tile || video.size(4) > opt.tiling.tile;
    VaeMoments m = (*vae)->encode(video, opt);
    at::Tensor mean = (*vae)->normalize_latents(m.mean)[0];
    // std in the normalised space: exp(logvar / 2) / latent_std per channel.
    at::Tensor unit = (*vae)->normalize_latents(at::zeros_like(m.mean));
    at::Tensor std = ((*vae)->normalize_latents(m.logvar.mul(0.5).exp()) - unit)[0];
    return std::make_pair(mean.cpu(), std.cpu());
  };
}

}  // namespace

FrameEncoder with_cache_faults(FrameEncoder base, const FaultConfig& faults) {
  if (faults.kind != FaultKind::poison_cache || faults.sample.empty()) return base;
  const std::string sample = faults.sample;
  return [base = std::move(base), sample](const at::Tensor& frames, const ClipRef& clip) {
    auto latents = base(frames, clip);
    if (sample == clip.key || sample == std::filesystem::path(clip.source).filename().string()) {
      latents.first = latents.first * 1000;
      std::fprintf(stderr, "fault injection: the cache entry of %s (%s) is written with its latents x 1000\n",
                   clip.source.c_str(), clip.key.c_str());
    }
    return latents;
  };
}

FrameEncoder make_frame_encoder(const Config& cfg) { return with_cache_faults(codec_encoder(cfg), cfg.faults); }

CaptionEncoder make_caption_encoder(const Config& cfg) {
  if (cfg.data.text_encoder != TextEncoder::demo) return {};
  const int64_t len = cfg.model.text_len, dim = cfg.model.text_dim;
  return [len, dim](const std::string& c) { return demo::embed_caption(c, len, dim); };
}

}  // namespace vidit
