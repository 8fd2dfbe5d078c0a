// Text to video with a Wan 2.1 model, in C++ from prompt to MP4:
//
//   prompt, negative prompt --umT5 (text/)--> context [2, 512, 4096]      phase "text"
//   noise [1, 16, 1+(F-1)/4, H/8, W/8] --DiT with classifier-free guidance, UniPC or Euler
//                                        (diffusion/, sample.*)--> latents   phase "denoise"
//   latents --Wan VAE decoder (vae/, causal chunks, tiled when asked)--> frames [F, H, W, 3]
//                                                                          phase "decode"
//
// Each model is loaded for its phase only and freed when the phase ends, so umT5-XXL (about
// 11 GB in bf16), the DiT and the VAE never sit in memory together; the report gives each phase's
// seconds and the memory it held at its peak (the CUDA caching allocator's peak on a GPU; on the
// host the peak of the ATen allocations the phase made, core/host_peak.h).
//
// Where the parts come from (WanWeights::find): a diffusers pipeline folder (model_index.json
// with transformer/, text_encoder/, tokenizer/, vae/) or an official Wan 2.1 release folder
// (config.json + diffusion_pytorch_model*.safetensors, the umT5 encoder, google/umt5-xxl/ for the
// tokenizer, Wan2.1_VAE as safetensors); any part may be named on its own instead (a vidit
// checkpoint's weights, text.encoder, data.vae_weights: a VAE file or folder, vae/vae_layout.h).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "pipeline/sampling_ranks.h"

namespace vidit {

// Wan 2.1's default negative prompt (its shared config's sample_neg_prompt): used by `vidit sample
// --weights` when neither --negative-prompt nor sample.negative_prompt gives one.
inline constexpr const char* kWanNegativePrompt =
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
    "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，"
    "杂乱的背景，三条腿，背景人很多，倒着走";

struct WanWeights {
  std::string transformer;   // weights path (model/weight_layout.h: either layout); "" if tensors given
  // A two-expert release (model/experts.h): `transformer` is the high-noise expert, this the
  // low-noise one, split at `boundary`; "" and 0 for one model.
  std::string transformer_2;
  double boundary = 0;
  std::string text_encoder;  // umT5: text_encoder folder, pipeline root or weight file
  std::string tokenizer;     // spiece.model or its folder; "" = beside text_encoder
  std::string vae;           // Wan 2.1 VAE: .safetensors (either layout) or folder (vae/vae_layout.h)
  // Image-to-video: the CLIP image encoder (a transformers CLIPVisionModel folder or file) and its
  // preprocessor_config.json (or the folder of one); "" where the model takes no image features.
  std::string image_encoder;
  std::string image_processor;
  // Fills whatever is empty from `root` (a diffusers pipeline or an official release folder; ""
  // = none). Throws vidit::Error naming the part it cannot find and the flag or key that gives it.
  void fill_from(const std::string& root);
  // Throws vidit::Error naming each part still empty, with the flag that gives it.
  void require_all() const;
};

struct VideoRequest {
  std::string prompt;
  std::string negative_prompt;  // "": the null prompt (the empty caption through umT5)
  int64_t frames = 81;          // 1 + 4k
  int64_t width = 832, height = 480;  // multiples of 16 (VAE 8 x patch 2)
  uint64_t seed = 1;
  // Image-to-video (model.condition): the first frame's picture file, and for first-and-last-frame
  // the last one's; "" = none. Each is resized to width x height for the VAE.
  std::string image, last_image;
};

// What an image-to-video model is conditioned on besides the text (pipeline/image_condition.h
// makes it from a request's pictures).
struct ImageCondition {
  at::Tensor frames;  // [1, 4 + C, T', h, w]: the given frames' mask and latent (diffusion/frame_condition.h)
  at::Tensor image;   // [1, tokens, model.image_dim]: CLIP features (undefined where image_dim = 0)
  // Wan 2.2 TI2V (a model that keeps its first frame): the picture's latent [1, C, 1, h, w], put in
  // place of the first latent frame before every call and in the result, its tokens at timestep 0.
  at::Tensor first;
  bool defined() const { return frames.defined() || first.defined(); }
};

struct PhaseReport {
  std::string name;
  double seconds = 0;
  int64_t peak_bytes = 0;  // on the phase's device (see above)
};

struct VideoResult {
  at::Tensor frames;                // [F, H, W, 3] uint8 RGB, CPU
  at::Tensor latents;               // [1, C, T', H/s, W/s] fp32, CPU (s: the VAE's stride, 8 or 16)
  std::vector<PhaseReport> phases;  // text, denoise, decode
};

// Checks a request against the VAE's and the model's granularity (`stride`: the VAE's pixels per
// latent cell, 8 for Wan 2.1's VAE, 16 for Wan 2.2's). Throws vidit::Error naming the value and
// the nearest valid ones.
void check_video_request(const VideoRequest& r, const ModelConfig& m, int64_t stride = 8);

// The VAE's pixels per latent cell for `w.vae`: 16 for the Wan 2.2 VAE (its config.json's
// is_residual), else 8. Throws vidit::Error naming the VAE when its latent channels are not the
// transformer's (the Wan 2.2 VAE with a 16-channel model or the reverse), and for image-to-video
// with the Wan 2.2 VAE (not sampled yet).
int64_t vae_stride(const WanWeights& w, const ModelConfig& m);

// Latent shape [1, C, 1 + (F-1)/4, H/stride, W/stride] of a request (C: the channels denoised,
// out_channels).
std::vector<int64_t> latent_shape(const VideoRequest& r, const ModelConfig& m, int64_t stride = 8);

// Runs the three phases on `device` with the config's sample.* (solver, steps, shift, cfg_scale)
// and text.* keys. `cfg.model` must describe the transformer (read_transformer_config gives it for
// a release). `transformer` when defined: the DiT's weights in official names (e.g. a vidit
// checkpoint's EMA), instead of reading weights.transformer. On CUDA the DiT runs under bf16
// autocast with fp32 weights, as training does.
// `ranks`: the ranks of a sampling job (sampling_ranks.h; nullptr or one rank: this process does
// everything), every one of which calls this with the same arguments; frames are then returned on
// rank 0 only, latents on every rank. sample.dtype = "bf16" holds the DiT's projections in bf16
// (with FSDP, parallel.shard > 1, the shards stay fp32) and runs it under bf16 autocast on the CPU too.
VideoResult generate_video(const Config& cfg, const WanWeights& weights, const VideoRequest& request,
                           at::Device device, const TensorMap& transformer = {}, bool verbose = true,
                           const SamplingRanks* ranks = nullptr);

// The low-noise expert of a two-expert model, for denoise_latents.
struct Expert2Weights {
  TensorMap weights;   // official names; empty for a one-model run
  std::string source;  // names them in errors
};

// The denoise phase alone: the DiT of cfg.model with the weights `whole` (official names, e.g.
// mapped from a file; `source` names them in errors), on this rank's share of the ranks as above,
// from `noise` [1, C, T', h, w] with the prompt's `context` and the `negative` one, each
// [1, text_len, text_dim]; returns the latents on `device`. What generate_video runs between
// the text and the decode, and what bench/bench_sample_ranks.cpp times. An image-to-video model
// (model.condition) needs `condition`: its frames are appended to the noisy latent at every step,
// and its image features attended by both guidance branches (only the text differs between them).
//
// Two experts (model.boundary > 0, model/experts.h): `whole` is the high-noise expert's, `low`
// the low-noise one's. Each step's timestep t picks the expert as diffusers'
// WanPipeline does (t >= boundary x 1000: high), with its own guidance scale (sample.cfg_scale,
// sample.cfg_scale_2 for the low-noise one); one expert is held at a time: the noise level only
// falls, so at the first step below the boundary the high-noise expert is freed and the low-noise
// one built from its weights (mapped files: read as the device copy is filled).
at::Tensor denoise_latents(const Config& cfg, const TensorMap& whole, const std::string& source, const at::Tensor& context,
                           const at::Tensor& negative, const at::Tensor& noise, at::Device device,
                           const SamplingRanks* ranks = nullptr, bool verbose = false,
                           const ImageCondition& condition = {}, const Expert2Weights& low = {});

// Writes result.frames to `path` as an H.264 MP4 at `fps`.
void write_video(const std::string& path, const at::Tensor& frames, double fps);

}  // namespace vidit
