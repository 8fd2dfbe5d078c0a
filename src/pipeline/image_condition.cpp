#include "pipeline/image_condition.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "diffusion/frame_condition.h"
#include "vae/vae_layout.h"
#include "vae/wan22_vae.h"
#include "vision/clip_vision.h"
#include "vision/image_file.h"
#include "vision/image_input.h"

namespace vidit {

std::pair<int64_t, int64_t> size_for_image(int64_t height, int64_t width, int64_t area, int64_t multiple) {
  VIDIT_CHECK(height > 0 && width > 0 && area > 0 && multiple > 0, "size_for_image: bad arguments");
  const double aspect = double(height) / double(width);
  auto fit = [&](double side) { return std::max<int64_t>(multiple, int64_t(std::llround(side)) / multiple * multiple); };
  return {fit(std::sqrt(double(area) * aspect)), fit(std::sqrt(double(area) / aspect))};
}

at::Tensor vae_image(const at::Tensor& rgb, int64_t height, int64_t width) {
  VIDIT_CHECK(rgb.dim() == 3 && rgb.size(2) == 3 && rgb.scalar_type() == at::kByte, "vae_image: a uint8 [H, W, 3] "
              "picture is needed, got ", rgb.sizes(), " ", rgb.scalar_type());
  at::Tensor x = rgb;
  if (x.size(0) != height || x.size(1) != width) x = vision::resize_like_pil(x, height, width, vision::Resample::lanczos);
  // As numpy does it: the pixels to fp32, / 255, then 2x - 1, each rounded to fp32.
  return (x.permute({2, 0, 1}).to(at::kFloat) / 255.0f * 2.0f - 1.0f).contiguous();
}

at::Tensor encode_frame_condition(WanVAEImpl& vae, const at::Tensor& first, const at::Tensor& last, int64_t frames,
                                  const VaeRunOptions& opts) {
  const at::Device device = vae.parameters().front().device();
  const at::Tensor video = condition_video(first.to(device), last.defined() ? last.to(device) : last, frames);
  at::Tensor latent;
  {
    at::NoGradGuard ng;
    latent = vae.encode_latents(video, opts);
  }
  const at::Tensor mask = frame_condition_mask(frames, latent.size(3), latent.size(4), last.defined()).to(device);
  return frame_condition(mask, latent.to(at::kFloat));
}

ImageCondition make_image_condition(const Config& cfg, const WanWeights& weights, const VideoRequest& request,
                                    at::Device device) {
  const ModelConfig& m = cfg.model;
  VIDIT_CHECK(m.condition != FrameCondition::none, "--image ", request.image, ": this model is text-to-video "
              "(model.condition = \"none\", model.in_channels = ", m.in_channels, "); give an image-to-video release "
              "(in_channels = 2 * out_channels + 4, e.g. 36) or leave --image out");
  VIDIT_CHECK(!request.image.empty(), "this model is image-to-video (model.condition = \"",
              name_of(m.condition), "\"): give the first frame with --image FILE");
  VIDIT_CHECK(request.last_image.empty() || request.frames > 1, "--last-image needs more than one frame (--frames)");
  const at::Tensor first_rgb = vision::decode_image_file(request.image);
  const at::Tensor last_rgb = request.last_image.empty() ? at::Tensor() : vision::decode_image_file(request.last_image);

  ImageCondition out;
  VIDIT_CHECK(!fuses_first_frame(m) || request.last_image.empty(), "--last-image: this model (Wan 2.2 TI2V) is "
              "conditioned on its first frame only");
  if (fuses_first_frame(m)) {  // Wan 2.2 TI2V: the picture alone through the Wan 2.2 VAE, its mean
    Wan22VAE vae = open_wan22_vae(weights.vae, at::TensorOptions().device(device));
    VIDIT_CHECK(vae->cfg.z_dim == m.out_channels, "the VAE '", weights.vae, "' makes ", vae->cfg.z_dim,
                "-channel latents, but the transformer denoises ", m.out_channels);
    at::NoGradGuard ng;
    const at::Tensor picture = vae_image(first_rgb, request.height, request.width).to(device);  // [3, H, W]
    out.first = vae->encode_latents(picture.unsqueeze(0).unsqueeze(2)).to(at::kFloat);         // [1, C, 1, h, w]
    return out;
  }
  {
    WanVAE vae = open_wan_vae(weights.vae, at::TensorOptions().device(device));
    VIDIT_CHECK(2 * vae->cfg.z_dim + 4 == m.in_channels, "the VAE '", weights.vae, "' makes ", vae->cfg.z_dim,
                "-channel latents, but the transformer takes ", m.in_channels, " = 2 x ", (m.in_channels - 4) / 2,
                " + 4 channels");
    VaeRunOptions ro;
    ro.tiling.enabled = request.width > 512 || request.height > 512;
    const at::Tensor last = last_rgb.defined() ? vae_image(last_rgb, request.height, request.width) : at::Tensor();
    out.frames = encode_frame_condition(*vae, vae_image(first_rgb, request.height, request.width), last, request.frames, ro);
  }
  if (m.image_dim > 0) {
    VIDIT_CHECK(!weights.image_encoder.empty(), "this image-to-video model attends to CLIP image features "
                "(model.image_dim = ", m.image_dim, "): give the image encoder with --image-encoder DIR (a "
                "transformers CLIPVisionModel folder; a diffusers pipeline's image_encoder/)");
    const vision::ClipImageConfig pre = weights.image_processor.empty()
                                            ? vision::ClipImageConfig::beside_encoder(weights.image_encoder)
                                            : vision::ClipImageConfig::load(weights.image_processor);
    std::vector<at::Tensor> pictures{first_rgb};
    if (last_rgb.defined()) pictures.push_back(last_rgb);
    // sample.dtype = "bf16": CLIP's weights and projections in bf16 too (on a CPU with AMX, 5x
    // transformers' fp32 speed; docs/BENCHMARKS.md); its residual stream stays fp32.
    const at::ScalarType dtype = cfg.sample.dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat;
    const vision::ClipVisionEncoder clip = vision::ClipVisionEncoder::load(weights.image_encoder, dtype, device);
    VIDIT_CHECK(clip.config().hidden_size == m.image_dim, "the image encoder '", weights.image_encoder, "' makes ",
                clip.config().hidden_size, "-wide features, but the transformer takes model.image_dim = ", m.image_dim);
    const at::Tensor features = clip.penultimate(vision::clip_pixel_values(pictures, pre).to(device));  // [n, 257, D]
    out.image = features.reshape({1, -1, features.size(2)}).to(at::kFloat);
    VIDIT_CHECK(m.image_pos_tokens == 0 || out.image.size(1) == m.image_pos_tokens, "this first-and-last-frame model "
                "takes ", m.image_pos_tokens, " image tokens (model.image_pos_tokens) but the pictures give ",
                out.image.size(1), ": give both --image and --last-image");
  }
  return out;
}

}  // namespace vidit
