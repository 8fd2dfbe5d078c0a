#include "pipeline/wan_pipeline.h"

#include <c10/core/InferenceMode.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/host_peak.h"
#include "core/precision.h"
#include "core/progress.h"
#include "diffusion/frame_condition.h"
#include "diffusion/sampler.h"
#include "core/unallocated.h"
#include "model/dit.h"
#include "parallel/parallelize.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "pipeline/image_condition.h"
#include "model/experts.h"
#include "text/text_encoder.h"
#include "vae/vae_layout.h"
#include "vae/wan22_vae.h"
#include "vae/wan_vae.h"
#include "video/video_decoder.h"

namespace vidit {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) { return fs::is_regular_file(p); }

// The first of `names` that exists under `dir`, or "".
std::string first_existing(const fs::path& dir, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (fs::exists(dir / n)) return (dir / n).string();
  return "";
}

// Peak memory of the current phase: the caching allocator's on a GPU; on the host the peak of
// ATen's allocations made during the phase (core/host_peak.h), or, when a profiler holds the
// hook HostPeak needs, the process's peak resident set (a high-water mark over its life).
struct PhaseMeter {
  explicit PhaseMeter(std::string name, at::Device device) : device(device), start(std::chrono::steady_clock::now()) {
    report.name = std::move(name);
    if (device.is_cuda()) cuda_reset_peak_memory(device.index() < 0 ? 0 : device.index());
    else host.emplace();
  }
  PhaseReport done() {
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (device.is_cuda()) {
      report.peak_bytes = cuda_peak_allocated_bytes(device.index() < 0 ? 0 : device.index());
    } else if (host && host->active()) {
      report.peak_bytes = host->peak();
    } else {
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      report.peak_bytes = int64_t(u.ru_maxrss) * 1024;
    }
    return report;
  }
  at::Device device;
  std::chrono::steady_clock::time_point start;
  PhaseReport report;
  std::optional<HostPeak> host;
};

}  // namespace

void WanWeights::fill_from(const std::string& root_path) {
  if (root_path.empty()) return;
  const fs::path root(root_path);
  VIDIT_CHECK(fs::is_directory(root), "weights '", root_path, "' is not a folder: give a diffusers pipeline folder "
              "(model_index.json) or an official Wan 2.1 / 2.2 release folder");
  // Two experts split by noise level (Wan 2.2 A14B, either layout): both, and their boundary.
  if (const std::optional<ExpertRelease> e = find_experts(root_path)) {
    if (transformer.empty()) transformer = e->high, transformer_2 = e->low, boundary = e->boundary;
  }
  if (fs::exists(root / "model_index.json")) {  // diffusers pipeline
    if (transformer.empty()) transformer = root.string();
    if (text_encoder.empty() && fs::is_directory(root / "text_encoder")) text_encoder = (root / "text_encoder").string();
    if (tokenizer.empty() && fs::is_directory(root / "tokenizer")) tokenizer = (root / "tokenizer").string();
    // vae/: diffusers' AutoencoderKLWan (or an official Wan2.1_VAE.safetensors put there).
    if (vae.empty() && fs::is_directory(root / "vae")) vae = find_vae_files(root.string()).weights;
    // Image-to-video with CLIP features (Wan 2.1 I2V): the encoder and its processor.
    if (image_encoder.empty() && fs::is_directory(root / "image_encoder")) image_encoder = (root / "image_encoder").string();
    if (image_processor.empty() && fs::is_directory(root / "image_processor"))
      image_processor = (root / "image_processor").string();
    return;
  }
  // An official release: the transformer's files at the top, the rest beside them.
  if (transformer.empty()) transformer = root.string();
  if (text_encoder.empty())
    text_encoder = first_existing(root, {"models_t5_umt5-xxl-enc-bf16.safetensors", "text_encoder",
                                         "models_t5_umt5-xxl-enc-bf16.pth"});
  if (tokenizer.empty()) tokenizer = first_existing(root, {"google/umt5-xxl", "tokenizer"});
  // Wan's own I2V releases ship open-clip's CLIP as a .pth under open-clip's names; vidit reads a
  // transformers CLIPVisionModel (diffusers' image_encoder/ of the same release).
  if (image_encoder.empty()) image_encoder = first_existing(root, {"image_encoder"});
  VIDIT_CHECK(!image_encoder.empty() || !is_file(root / "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"),
              "weights '", root_path, "' has Wan's open-clip image encoder as a .pth (open-clip's names), which "
              "vidit does not read: give --image-encoder DIR, a transformers CLIPVisionModel folder such as the "
              "image_encoder/ of the same release in diffusers' layout (Wan-AI/Wan2.1-I2V-14B-480P-Diffusers)");
  if (vae.empty()) {
    vae = first_existing(root, {"Wan2.1_VAE.safetensors"});
    VIDIT_CHECK(!vae.empty() || !is_file(root / "Wan2.1_VAE.pth"), "weights '", root_path, "' has Wan2.1_VAE.pth, "
                "a pickle vidit does not read; convert it once: python -c \"import torch, safetensors.torch as s; "
                "s.save_file(torch.load('Wan2.1_VAE.pth', map_location='cpu'), 'Wan2.1_VAE.safetensors')\"");
  }
}

void WanWeights::require_all() const {
  std::string missing;
  if (transformer.empty()) missing += "\n  the transformer: --weights DIR or --checkpoint DIR";
  if (text_encoder.empty()) missing += "\n  the umT5 text encoder: --text-encoder DIR (or text.encoder)";
  if (vae.empty()) missing += "\n  the Wan 2.1 VAE: --vae FILE.safetensors (or data.vae_weights)";
  VIDIT_CHECK(missing.empty(), "vidit sample: missing", missing);
}

void check_video_request(const VideoRequest& r, const ModelConfig& m, int64_t stride) {
  VIDIT_CHECK(r.frames >= 1 && (r.frames - 1) % 4 == 0, "--frames ", r.frames, " must be 1 + 4k (the VAE codes frame "
              "0 alone and then groups of 4): e.g. ", 1 + 4 * ((std::max<int64_t>(r.frames, 1) - 1) / 4), " or ",
              1 + 4 * ((std::max<int64_t>(r.frames, 1) + 2) / 4));
  const int64_t gh = stride * m.patch[1], gw = stride * m.patch[2];
  VIDIT_CHECK(r.height > 0 && r.height % gh == 0, "--size: height ", r.height, " must be a multiple of ", gh,
              " (VAE ", stride, " x patch ", m.patch[1], "): e.g. ", std::max<int64_t>(gh, r.height / gh * gh));
  VIDIT_CHECK(r.width > 0 && r.width % gw == 0, "--size: width ", r.width, " must be a multiple of ", gw,
              " (VAE ", stride, " x patch ", m.patch[2], "): e.g. ", std::max<int64_t>(gw, r.width / gw * gw));
  VIDIT_CHECK(((r.frames - 1) / 4 + 1) % m.patch[0] == 0, "--frames ", r.frames, ": ", (r.frames - 1) / 4 + 1,
              " latent frames are not a multiple of the time patch ", m.patch[0]);
}

std::vector<int64_t> latent_shape(const VideoRequest& r, const ModelConfig& m, int64_t stride) {
  return {1, m.out_channels, (r.frames - 1) / 4 + 1, r.height / stride, r.width / stride};
}

namespace {

// The DiT's weights to sample with: official names, whole (mapped from the file, or given).
TensorMap transformer_weights(const WanWeights& weights, const TensorMap& given) {
  return given.empty() ? read_transformer_weights(weights.transformer) : given;
}

// sample.dtype = "bf16": the projections' weights (every 2-D parameter: the Linear layers, the
// bulk of the DiT) are held in bf16, the norms, modulation tables and biases in fp32. Before any
// memory is given to them (a model built without storage).
void hold_projections_in(DiTImpl& model, at::ScalarType dtype) {
  if (dtype == at::kFloat) return;
  torch::NoGradGuard ng;
  for (auto& p : model.parameters())
    if (p.dim() == 2) p.set_data(unallocated(p.sizes(), p.options().dtype(dtype)));
}

}  // namespace

at::Tensor denoise_latents(const Config& cfg, const TensorMap& whole, const std::string& source, const at::Tensor& context,
                           const at::Tensor& negative, const at::Tensor& noise, at::Device device,
                           const SamplingRanks* ranks, bool verbose, const ImageCondition& condition,
                           const Expert2Weights& low) {
  c10::InferenceMode inference;
  VIDIT_CHECK(condition.defined() == (cfg.model.condition != FrameCondition::none),
              condition.defined() ? "a frame condition was given to a text-to-video model (model.condition = \"none\")"
                                  : "an image-to-video model (model.condition) needs the condition frames");
  // The condition frames and image features on the device, once; the same for both guidance branches.
  const at::Tensor frames = condition.frames.defined() ? condition.frames.to(device) : at::Tensor();
  const at::Tensor image = condition.image.defined() ? condition.image.to(device) : at::Tensor();
  const at::Tensor first = condition.first.defined() ? condition.first.to(device) : at::Tensor();
  const bool many = ranks && ranks->size() > 1;
  verbose = verbose && (!ranks || ranks->lead());
  const at::ScalarType weight_dtype = cfg.sample.dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat;
  const bool two = cfg.model.boundary > 0;
  VIDIT_CHECK(two == !low.weights.empty(), two ? "a two-expert model (model.boundary > 0) needs its low-noise expert's "
              "weights (a release's transformer_2/ or low_noise_model/)" : "a low-noise expert was given to a one-model "
              "run (model.boundary = 0)");
  // The DiT on the device from `weights`, filled a tensor at a time (on many ranks: this rank's
  // part of it, on its mesh).
  struct Resident {
    DiT model{nullptr};
    std::unique_ptr<ParallelModel> pm;
  };
  auto build = [&](const TensorMap& weights, const std::string& from) {
    Resident r;
    r.model = dit_without_storage(cfg.model, device);
    if (!many) {
      hold_projections_in(*r.model, weight_dtype);
      load_state_dict(*r.model, weights, from);
    } else {
      const bool sharded = ranks->mesh_config.parallel.shard > 1;
      if (!sharded) hold_projections_in(*r.model, weight_dtype);  // FSDP's shards stay fp32 (1/S each)
      r.pm = parallelize(r.model, ranks->mesh, ranks->mesh_config);
      check_state_dict(r.pm->whole_shapes(), weights, from);
      torch::NoGradGuard ng;
      for (const auto& [name, p] : r.pm->params()) {
        allocate(p);
        p.copy_(r.pm->local(name, weights.at(name)));
      }
    }
    // Nothing here trains: parameters that require no gradient are not kept as cast copies by
    // autocast (it caches only those that do), so a forward holds one projection's bf16 cast at a
    // time instead of a bf16 copy of the whole model.
    for (auto& p : r.model->parameters()) p.requires_grad_(false);
    r.model->eval();
    return r;
  };
  Resident resident = build(whole, source);
  bool on_low = false;
  // Step i/N with rate and time left: guidance evaluates both branches in one call (or one on
  // each half of the ranks), so one call is one step.
  Progress::Options po;
  po.label = "sample";
  po.unit = "step";
  po.total = cfg.sample.steps;
  if (!verbose) po.out = nullptr;
  Progress progress(po);
  const bool autocast_bf16 = device.is_cuda() || weight_dtype == at::kBFloat16;
  const bool halves = many && ranks->halves;
  auto model_field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& txt) {
    AutocastGuard autocast(device.type(), autocast_bf16, at::kBFloat16);
    const at::Tensor img = image.defined() ? image.expand({x.size(0), -1, -1}) : image;
    if (first.defined())  // Wan 2.2 TI2V: the picture's latent as the first frame, at timestep 0
      return resident.model->forward(keep_first_frame(x, first), first_frame_timesteps(t, x.sizes(), cfg.model.patch),
                                     txt, img).to(at::kFloat);
    return resident.model->forward(with_frame_condition(x, frames), t, txt, img).to(at::kFloat);
  };
  // Two experts: the expert and its guidance for this step's timestep (diffusers' rule).
  const double boundary_t = cfg.model.boundary * 1000.0;
  // Guidance on or off for both experts by sample.cfg_scale, as everywhere else (the ranks' halves,
  // the memory plan); the low-noise expert's own scale where it is on.
  const double low_scale = cfg.sample.cfg_scale == 1.0 ? 1.0
                           : cfg.sample.cfg_scale_2 > 0 ? cfg.sample.cfg_scale_2 : cfg.sample.cfg_scale;
  auto scale_for = [&](const at::Tensor& t) {
    if (!two) return cfg.sample.cfg_scale;
    if (!on_low && t.flatten()[0].item<double>() < boundary_t) {
      if (resident.pm) resident.pm->after_forward_only();
      resident = Resident{};  // the high-noise expert freed before the low-noise one is built
      resident = build(low.weights, low.source);
      on_low = true;
      if (verbose) std::printf("[sample] the low-noise expert from step %lld (timestep below %g)\n",
                               (long long)progress.snapshot().done + 1, boundary_t), std::fflush(stdout);
    }
    return on_low ? low_scale : cfg.sample.cfg_scale;
  };
  const at::Tensor negative_on = negative.to(device);
  auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& txt) {
    const double scale = scale_for(t);
    at::Tensor v;
    if (halves) v = combine_guidance(*ranks, model_field(x, t, txt), scale);
    else if (two) v = guided_velocity(model_field, x, t, txt, negative_on, scale);  // the sampler's own guidance off
    else v = model_field(x, t, txt);
    progress.advance();  // on a GPU the launch queue fills within a step, so the rate is right after one
    return v;
  };
  at::Tensor lat;
  SampleConfig one = cfg.sample;
  if (halves || two) one.cfg_scale = 1.0;  // guidance is applied in the field
  if (halves) {  // this half's text; the field combines the two halves' velocities itself
    lat = sample_latents(field, noise.to(device), (ranks->branch == 0 ? context : negative).to(device), negative_on, one);
  } else {
    lat = sample_latents(field, noise.to(device), context.to(device), negative_on, one);
  }
  if (resident.pm) resident.pm->after_forward_only();
  progress.finish();
  return first.defined() ? keep_first_frame(lat, first) : lat;
}

int64_t vae_stride(const WanWeights& w, const ModelConfig& m) {
  if (!is_wan22_vae(w.vae)) {
    VIDIT_CHECK(m.out_channels != 48, "the transformer denoises 48 latent channels (Wan 2.2's VAE, TI2V-5B) but the VAE '",
                w.vae, "' is not the Wan 2.2 VAE in diffusers' layout (a vae/ folder with its config.json); give "
                "--vae Wan2.2-TI2V-5B-Diffusers/vae (vidit does not read the official Wan2.2_VAE.pth)");
    return 8;
  }
  const int64_t z = wan22_vae_config_from_diffusers(find_vae_files(w.vae).config).z_dim;
  VIDIT_CHECK(z == m.out_channels, "the VAE '", w.vae, "' is the Wan 2.2 VAE of ", z, " latent channels but the "
              "transformer denoises ", m.out_channels, " (a Wan 2.1 model takes the Wan 2.1 VAE); give the VAE of the "
              "transformer's release");
  VIDIT_CHECK(m.condition == FrameCondition::none || fuses_first_frame(m), "the VAE '", w.vae, "' is the Wan 2.2 VAE, "
              "whose image-to-video model (TI2V-5B) keeps the first frame in its latent, but this transformer takes "
              "Wan 2.1's condition channels (in_channels ", m.in_channels, "); give the VAE of its release");
  return 16;
}

VideoResult generate_video(const Config& cfg, const WanWeights& weights, const VideoRequest& request,
                           at::Device device, const TensorMap& transformer, bool verbose, const SamplingRanks* ranks) {
  c10::InferenceMode inference;
  const int64_t stride = vae_stride(weights, cfg.model);
  const bool wan22 = stride == 16;
  check_video_request(request, cfg.model, stride);
  const bool many = ranks && ranks->size() > 1;
  const bool lead = !ranks || ranks->lead();
  verbose = verbose && lead;
  VideoResult out;

  // 1. Text: the prompt and the negative prompt (or the null prompt) through umT5, then freed;
  //    with many ranks, on rank 0, the two contexts broadcast.
  at::Tensor context, negative;
  {
    PhaseMeter meter("text", device);
    at::Tensor both;
    if (lead) {
      text::TextEncoderOptions topt = text::text_encoder_options(cfg);
      topt.encoder = weights.text_encoder;
      topt.tokenizer = weights.tokenizer;
      topt.device = device;
      text::TextEncoder encoder(topt);
      VIDIT_CHECK(encoder.dim() == cfg.model.text_dim, "the text encoder '", weights.text_encoder, "' makes ",
                  encoder.dim(), "-wide embeddings but the transformer takes model.text_dim = ", cfg.model.text_dim);
      text::EncodedCaptions enc = encoder.encode_captions({request.prompt, request.negative_prompt});
      if (enc.truncated[0])
        std::fprintf(stderr, "warning: the prompt is longer than %lld tokens and was cut there\n",
                     (long long)encoder.text_len());
      both = enc.embedding;
    }
    if (many) both = broadcast_any(*ranks->world, both, 0, device);
    context = both.slice(0, 0, 1);
    negative = both.slice(0, 1, 2);
    out.phases.push_back(meter.done());
  }
  if (verbose)
    std::printf("[sample] text encoded in %.1f s\n", out.phases.back().seconds), std::fflush(stdout);

  // 1b. Image-to-video: the pictures through the VAE (the condition frames) and CLIP (the image
  //     features), then freed (pipeline/image_condition.h); on rank 0, broadcast.
  ImageCondition condition;
  if (cfg.model.condition != FrameCondition::none || !request.image.empty()) {
    PhaseMeter meter("image", device);
    if (lead) condition = make_image_condition(cfg, weights, request, device);
    if (many && fuses_first_frame(cfg.model)) {
      condition.first = broadcast_any(*ranks->world, condition.first, 0, device);
    } else if (many) {
      condition.frames = broadcast_any(*ranks->world, condition.frames, 0, device);
      if (cfg.model.image_dim > 0) condition.image = broadcast_any(*ranks->world, condition.image, 0, device);
    }
    out.phases.push_back(meter.done());
    if (verbose) std::printf("[sample] image condition encoded in %.1f s\n", out.phases.back().seconds), std::fflush(stdout);
  }

  // 2. Denoise: the DiT with guidance, stepped by the configured solver; freed at the end. With
  //    many ranks: parallelized on this rank's mesh (sampling_ranks.h), its part of the weights
  //    copied from the mapped file, guidance on two halves when the ranks are so laid out.
  {
    PhaseMeter meter("denoise", device);
    at::Tensor noise = at::randn(latent_shape(request, cfg.model, stride),
                                 at::make_generator<at::CPUGeneratorImpl>(request.seed), at::kFloat);
    // Two experts: both mapped (each read as its device copy is filled, one at a time).
    const bool two = cfg.model.boundary > 0;
    VIDIT_CHECK(!two || (!weights.transformer_2.empty() && transformer.empty()), "a two-expert model (model.boundary = ",
                cfg.model.boundary, ") samples from a release holding both experts: give --weights RELEASE");
    std::vector<std::shared_ptr<const MappedFile>> mapped;
    const TensorMap whole = two ? read_transformer_weights(weights.transformer, &mapped)
                                : transformer_weights(weights, transformer);
    Expert2Weights low;
    if (two) low.weights = read_transformer_weights(weights.transformer_2, &mapped), low.source = weights.transformer_2;
    at::Tensor lat = denoise_latents(cfg, whole, transformer.empty() ? weights.transformer : "the given transformer weights",
                                     context, negative, noise, device, ranks, verbose, condition, low);
    out.latents = lat.to(at::kCPU, at::kFloat);
    out.phases.push_back(meter.done());
  }
  if (verbose) std::printf("[sample] denoised in %.1f s\n", out.phases.back().seconds), std::fflush(stdout);

  // 3. Decode: the Wan VAE decoder (2.1's, or 2.2's for its 48 channels), in causal chunks (tiled
  //    for frames wider than 512 pixels).
  //    With many ranks a tiled decode shares its tiles among them; an untiled one is rank 0's.
  {
    PhaseMeter meter("decode", device);
    VaeRunOptions ro;
    ro.tiling.enabled = request.width > 512 || request.height > 512;
    TileShare share;
    // (The Wan 2.2 VAE tiles as diffusers does, on the rank that decodes: rank 0.)
    if (many && ro.tiling.enabled && !wan22) share = tile_share(*ranks, device), ro.share = &share;
    if (lead || ro.share) {
      const at::TensorOptions on = at::TensorOptions().device(device);
      const at::Tensor video = wan22 ? open_wan22_vae(weights.vae, on)->decode_latents(out.latents.to(device), ro)
                                     : open_wan_vae(weights.vae, on)->decode_latents(out.latents.to(device), ro);
      // [1, 3, F, H, W] in [-1, 1]
      if (lead)
        out.frames = ((video[0].permute({1, 2, 3, 0}) + 1.0) * 127.5).round().clamp(0, 255).to(at::kByte).to(at::kCPU).contiguous();
    }
    out.phases.push_back(meter.done());
  }
  if (verbose) std::printf("[sample] decoded in %.1f s\n", out.phases.back().seconds), std::fflush(stdout);
  return out;
}

void write_video(const std::string& path, const at::Tensor& frames, double fps) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  encode_video_mp4(path, frames, fps, /*crf=*/18, /*upscale=*/1);
}

}  // namespace vidit
