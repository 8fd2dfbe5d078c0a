// Samples while a run trains (sample.every): every N steps and at the last step, the run's
// sampling weights (the EMA; a LoRA run's base with its adapters merged) generate a fixed set of
// prompts with the same noise each time, so that one prompt's videos can be compared across
// steps. Each video goes to <out_dir>/samples/step_NNNNNNN/<i>_<caption>.mp4 (H.264, sample.fps)
// and to TensorBoard as an image, `samples/<i>_<caption>`: up to 8 frames side by side.
//
// The prompts: sample.prompts, embedded once at the start by the run's caption path (umT5 from
// text.* when text.encoder is set, else the demo's embedder), at the size of the cache's most
// common bucket; or, with sample.prompts empty, sample.count clips of the cache itself (one per
// bucket first), each with its cached text embedding at its own bucket's latent size, which needs
// no text encoder at all (precomputed embeddings too). Guidance steers away from the run's null
// text (caption dropout's), or from sample.negative_prompt's embedding where it is encoded.
//
// The solver, steps, shift and guidance scale are sample.*'s (diffusion/sampler.h). The latents
// go back to frames through the run's codec: the demo codec, or the Wan VAE decoder of
// data.vae_weights (loaded for each round and freed after it).
//
// On a mesh (write_on_mesh, what `vidit train` does): every rank samples with the run's own
// parallelized model, each holding its part of the weights as in training (FSDP gathers a block
// at a time, sequence parallel splits the tokens, tensor parallel the heads), with the sampling
// weights swapped in (Trainer::with_sampling_weights: one more copy of the rank's part while a
// round runs); the prompts are split over the data-parallel ranks, the latents sent to rank 0,
// which decodes and writes. No rank ever holds the whole model. write() with whole weights builds
// one whole copy of the DiT instead (one process, tests).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/dit.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace vidit {

class LatentCache;
class TensorBoardWriter;

struct SamplePrompt {
  std::string caption;
  at::Tensor text;                    // [text_len, D] fp32, zeros after the caption's tokens
  std::vector<int64_t> latent_shape;  // [C, T, H, W] of the latents to sample
  std::string bucket;                 // the bucket whose size it has
  // Image-to-video (model.condition): a cached clip's condition frames [4 + C, T, H, W] (mask and
  // latent) and CLIP features [tokens, D]; the clip's own, or for a named prompt the first clip
  // of its bucket. Undefined for text-to-video.
  at::Tensor condition, image;
  // Wan 2.2 TI2V's first-frame form (diffusion/frame_condition.h): the clip's first latent frame
  // [C, 1, H, W], kept in place of the sample's; undefined otherwise.
  at::Tensor first;
};

// The prompts of a run as described above. Throws vidit::Error when sample.prompts is set but the
// run has no caption path (data.text_encoder = "precomputed" without text.encoder), or when the
// cache is empty.
std::vector<SamplePrompt> training_sample_prompts(const Config& cfg, const LatentCache& cache);

class TrainingSamples {
 public:
  TrainingSamples(Config cfg, std::vector<SamplePrompt> prompts, at::Tensor null_text, at::Device device);

  // sample.every divides `step`, or `step` is the run's last (train.steps).
  bool due(int64_t step) const;
  // One round with these whole DiT weights (official names): writes the videos and, with `tb`,
  // the images at `step`. Returns the paths of the videos.
  std::vector<std::string> write(const TensorMap& weights, int64_t step, TensorBoardWriter* tb) const;

  // A set for a rank other than the lead, empty until share() fills it.
  TrainingSamples(Config cfg, at::Device device);
  // Rank 0's prompts and its null and negative texts to every rank of `world`. Collective.
  void share(Comm& world);
  // One round on every rank of `mesh` (above): `model` is the run's parallelized DiT holding the
  // sampling weights. Returns the videos' paths on rank 0, nothing elsewhere. Collective.
  std::vector<std::string> write_on_mesh(DiT& model, const Mesh& mesh, int64_t step, TensorBoardWriter* tb) const;
  // The latents [C, T, H, W] of every prompt, CPU fp32: from whole weights in this process, or on
  // every rank of `mesh` as write_on_mesh samples them (every rank gets every prompt's).
  std::vector<at::Tensor> latents(const TensorMap& weights) const;
  std::vector<at::Tensor> latents_on_mesh(DiT& model, const Mesh& mesh) const;

  const std::vector<SamplePrompt>& prompts() const { return prompts_; }

 private:
  at::Tensor noise(size_t i) const;  // prompt i's noise [1, C, T, H, W], the same every round
  // Decodes the latents, writes the videos and the TensorBoard images (rank 0).
  std::vector<std::string> write_videos(const std::vector<at::Tensor>& latents, int64_t step, TensorBoardWriter* tb) const;
  // Latents [C, T, H, W] -> frames [T, H, W, 3] uint8 through the run's codec.
  std::vector<at::Tensor> decode(const std::vector<at::Tensor>& latents) const;

  Config cfg_;
  std::vector<SamplePrompt> prompts_;
  at::Tensor null_text_, negative_text_;
  at::Device device_;
};

// Frames [T, H, W, 3] uint8 as one image for viewing: up to `max_frames` evenly spaced frames side
// by side, upscaled by a whole factor to at least 64 pixels high, subsampled when the row would be
// wider than 4096. Returns [h, w, 3] uint8, and the upscale factor used in `upscale`.
at::Tensor frame_strip(const at::Tensor& frames, int64_t max_frames = 8, int* upscale = nullptr);

}  // namespace vidit
