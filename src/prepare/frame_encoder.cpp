#include "prepare/frame_encoder.h"

#include <torch/cuda.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "prepare/caption_embedder.h"
#include "prepare/demo_codec.h"
#include "diffusion/frame_condition.h"
#include "vae/wan22_vae.h"
#include "vae/wan_vae.h"
#include "vision/clip_vision.h"
#include "vision/image_input.h"

namespace vidit {

namespace {

// Where data.encode_device puts the encoders.
at::Device encode_device(const Config& cfg) {
  const bool has_cuda = torch::cuda::is_available();
  VIDIT_CHECK(cfg.data.encode_device != DeviceChoice::cuda || has_cuda, cfg.source, ": data.encode_device = \"cuda\" but no CUDA "
              "device is visible to this build; use \"auto\" or \"cpu\"");
  return cfg.data.encode_device == DeviceChoice::cpu || !has_cuda ? at::Device(at::kCPU) : at::Device(at::kCUDA);
}

// The VAE of data.vae_weights, loaded once per device for the clips' latents and their
// condition latents: the Wan 2.1 VAE (of the shape its diffusers config states, else Wan 2.1's)
// or the Wan 2.2 VAE.
template <class Vae>
std::shared_ptr<Vae> shared_vae(const Config& cfg, Vae (*open)(const std::string&, const at::TensorOptions&)) {
  VIDIT_CHECK(!cfg.data.vae_weights.empty(), cfg.source, ": data.codec = \"", name_of(cfg.data.codec),
              "\" needs data.vae_weights (the VAE's weights: a vae/ folder or a diffusers pipeline root)");
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Vae>> loaded;
  const at::Device device = encode_device(cfg);
  const std::string key = cfg.data.vae_weights + "@" + device.str();
  std::lock_guard<std::mutex> lock(mu);
  if (auto vae = loaded[key].lock()) return vae;
  auto vae = std::make_shared<Vae>(open(cfg.data.vae_weights, at::TensorOptions().device(device)));
  loaded[key] = vae;
  return vae;
}
std::shared_ptr<WanVAE> shared_vae(const Config& cfg) { return shared_vae<WanVAE>(cfg, &open_wan_vae); }

// uint8 frames [T, H, W, 3] -> the VAE's pixels [1, 3, T, H, W] in [-1, 1].
at::Tensor vae_pixels(const at::Tensor& frames, at::Device device) {
  return frames.to(device).permute({3, 0, 1, 2}).unsqueeze(0).to(at::kFloat).div(127.5).sub(1.0);
}

// A VAE's posterior of the frames, in the normalised latent space the DiT trains in.
template <class Vae>
FrameEncoder vae_encoder(std::shared_ptr<Vae> vae, at::Device device) {
  return [vae, device](const at::Tensor& frames, const ClipRef&) {
    at::NoGradGuard no_grad;
    at::Tensor video = vae_pixels(frames, device);
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

// The encoder data.codec names.
FrameEncoder codec_encoder(const Config& cfg) {
  if (cfg.data.codec == Codec::demo) {
    const int64_t block = cfg.demo.codec_block;
    return [block](const at::Tensor& frames, const ClipRef&) {
      at::Tensor mean = demo::codec_encode(frames, block);
      return std::make_pair(mean, at::zeros_like(mean));  // lossless: no spread
    };
  }
  const at::Device device = encode_device(cfg);
  if (cfg.data.codec == Codec::wan22_vae) {
    auto vae = shared_vae<Wan22VAE>(cfg, &open_wan22_vae);
    VIDIT_CHECK((*vae)->cfg.z_dim == cfg.model.out_channels, cfg.source, ": data.vae_weights '", cfg.data.vae_weights,
                "' is the Wan 2.2 VAE of ", (*vae)->cfg.z_dim, " latent channels but model.out_channels is ",
                cfg.model.out_channels, "; a cache made so would not train this model (Wan 2.2 TI2V-5B: 48)");
    return vae_encoder(vae, device);
  }
  return vae_encoder(shared_vae(cfg), device);
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

ConditionEncoder make_condition_encoder(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  // Nothing to cache for a model that keeps the first frame in its latent (Wan 2.2 TI2V): the
  // causal VAE's first latent frame of the clip is its first picture's.
  if (!appends_condition(m)) return {};
  const std::string kind = name_of(m.condition);
  VIDIT_CHECK(cfg.data.codec == Codec::wan_vae, cfg.source, ": model.condition = \"", kind, "\" needs data.codec = "
              "\"wan_vae\": the condition frames are encoded by the Wan 2.1 VAE, whose 4-frame stride the mask follows",
              cfg.data.codec == Codec::wan22_vae ? " (with the Wan 2.2 VAE, TI2V-5B keeps the first frame in its latent: "
                                                   "set model.in_channels = model.out_channels)" : "");
  VIDIT_CHECK(m.image_dim == 0 || !cfg.data.image_encoder.empty(), cfg.source, ": model.image_dim = ", m.image_dim,
              ": the model attends to CLIP image features; set data.image_encoder to its CLIP image encoder (a "
              "transformers CLIPVisionModel folder, or a diffusers pipeline root with image_encoder/)");
  const at::Device device = encode_device(cfg);
  auto vae = shared_vae(cfg);
  std::shared_ptr<const vision::ClipVisionEncoder> clip;
  vision::ClipImageConfig processor;
  if (m.image_dim > 0) {
    clip = std::make_shared<const vision::ClipVisionEncoder>(
        vision::ClipVisionEncoder::load(cfg.data.image_encoder, at::kFloat, device));
    VIDIT_CHECK(clip->config().hidden_size == m.image_dim, cfg.source, ": data.image_encoder '", cfg.data.image_encoder,
                "' makes ", clip->config().hidden_size, "-wide features but model.image_dim = ", m.image_dim);
    processor = vision::ClipImageConfig::beside_encoder(cfg.data.image_encoder);
  }
  const bool last = m.condition == FrameCondition::first_last_frame;
  return [vae, clip, processor, device, last](const at::Tensor& frames, const ClipRef&) {
    at::NoGradGuard no_grad;
    const int64_t t = frames.size(0);
    const at::Tensor pixels = vae_pixels(frames, device)[0];  // [3, T, H, W]
    const at::Tensor video = condition_video(pixels.select(1, 0), last ? pixels.select(1, t - 1) : at::Tensor(), t);
    VaeRunOptions opt;
    opt.tiling.enabled = video.size(3) > opt.tiling.tile || video.size(4) > opt.tiling.tile;
    ClipCondition out;
    out.latent = (*vae)->encode_latents(video, opt)[0].cpu();
    if (clip) {
      std::vector<at::Tensor> pictures{frames[0].contiguous()};
      if (last) pictures.push_back(frames[t - 1].contiguous());
      const at::Tensor features = clip->penultimate(vision::clip_pixel_values(pictures, processor).to(device));
      out.image = features.reshape({-1, features.size(2)}).cpu();  // the pictures' tokens one after the other
    }
    return out;
  };
}

CaptionEncoder make_caption_encoder(const Config& cfg) {
  if (cfg.data.text_encoder != TextEncoder::demo) return {};
  const int64_t len = cfg.model.text_len, dim = cfg.model.text_dim;
  return [len, dim](const std::string& c) { return demo::embed_caption(c, len, dim); };
}

}  // namespace vidit
