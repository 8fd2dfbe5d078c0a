// The peak memory of Wan sampling, predicted per phase without running anything: what
// `vidit plan --sample FxWxH` prints and sample_memory_test.cpp checks against a measurement.
//
// generate_video (wan_pipeline.h) loads each model for its phase only, so the phases' peaks do
// not add up: the run needs the largest of three. Each phase's peak is the larger of
//   loading:  the weights plus what loading holds beside them for a moment, and
//   running:  the weights plus the tensors alive at the phase's busiest moment,
// each term below counted from the code as it is (which tensor is alive where, its shape and
// dtype), not fitted to a measurement:
//
//   text     umT5 weights (text.dtype; norms fp32). Loading: Umt5Encoder::load keeps every tensor
//            it converted until the encoder is built, and the encoder concatenates q,k,v and the
//            two gated FFN inputs into new tensors, so those are held twice for a moment.
//            Running (the prompt and the negative prompt, only their real tokens R): the fp32
//            residual [R, d], the attention output, the fused qkv [R, 3 inner], the normed input,
//            the position-bias tensors [H, n, n] per distinct length n and their int64 bucket
//            indices, and at the FFN's second projection its input [R, 2 d_ff] with the gated
//            product [R, d_ff] and the output [R, d].
//   image    image-to-video only (model.condition): first the Wan VAE (weights fp32, loading as
//            in decode) encodes the condition video [3, F, H, W] fp32 (the picture, zeros, and the
//            last picture for first-and-last) in causal chunks of 4 frames: the video, the
//            resized pictures, the causal cache, the busiest encoder layer of a chunk (a residual
//            block at full size: its input, the norm and SiLU, the cache-prepended sequence, the
//            conv's output and scratch; a downsampling layer: the per-frame copy, the padded
//            frames, the strided conv), and the moments and latents; then, the VAE freed, CLIP
//            (weights fp32, mapped files copied in; ViT-H/14 unless given) runs the 1 or 2
//            pictures to its penultimate layer: the pixels, a layer's residual stream, qkv,
//            attention output and MLP hidden [n, tokens, 4 hidden] fp32, beside the condition
//            latent kept from the VAE. The phase's peak is the larger of the two stages.
//   denoise  DiT weights fp32, or with sample.dtype = "bf16" its 2-D (projection) weights in bf16;
//            over ranks, this rank's part (FSDP's 1/shard, plus two blocks gathered whole at once
//            and the root's embeddings and head; tensor parallel's 1/tensor of the blocks'
//            projections). Loading on the CPU: the weight file's tensors beside the model's
//            (load_state_dict copies). The model is built on its device straight from the file,
//            so the GPU sees the weights only; its parameters do not require gradients, so bf16
//            autocast keeps no cast copies: one projection's cast at a time.
//            Running, one forward of batch B = 2 (guidance evaluates both branches at once; 1 on
//            each half when the ranks split guidance) over this rank's tokens L / sp of the
//            L = T'/pt * H'/ph * W'/pw tokens (plus, over sp ranks, the exchanges' buffers): the text input and its padded copy [B, 512, 4096],
//            the context [B, 512, dim], the RoPE tables, and the busiest point of a block, the MLP's
//            second projection, where 11 [B, L, dim] tensors (the block's input; q, k, v, which the
//            block keeps to its end; the attention output and its projection; the residual and
//            LayerNorm output; the cross-attention output; the next residual and its modulated
//            norm; the projection's output) and 2 [B, L, ffn] tensors (fc1's output and its GELU)
//            are alive. Attention never materialises [L, L]: on the CPU SDPA runs its flash kernel
//            (fp32, output [B, L, heads, hd]), on CUDA flash / cuDNN. dtypes: on the CPU all fp32;
//            on CUDA projection and attention outputs bf16, the residual stream, norms and RoPE fp32.
//            The sampler's latents (noise, x, the batch-2 input and output) are a few latent sizes.
//            Image-to-video adds the condition latent (mask and condition, in_channels - out_channels
//            wide) and the model input's extra channels, the image features [B, n x 257, image_dim]
//            fp32 and their projection in the context, and at cross-attention the image branch's
//            output [B, L, dim] beside the text branch's.
//   decode   the whole Wan VAE's weights fp32 (encoder included: the pipeline builds it whole).
//            Loading: the file's tensors beside the module's (load_safetensors, then copies).
//            Running: decoding one latent frame at a time (4 video frames), the causal cache (each
//            time-padded convolution keeps its last 2 input frames), the busiest layer of the
//            chunk (a residual block's second conv: its input, the first conv's output, the
//            norm and SiLU of it, the cache-prepended sequence, the output; an upsampling layer:
//            the time conv's doubled frames, their reshaped copy, the x2 nearest upsample and
//            the conv's output), each CPU convolution's scratch (oneDNN's copies of its input and
//            weight, or ATen's slow path's vol2col buffer, by ATen's own rule for choosing), the
//            frames decoded so far; with tiling, one tile at a time into a full-size accumulator. At the end the pipeline turns the clamped video into uint8
//            through four fp32 temporaries (+1, *127.5, round, clamp) and two uint8 copies.
//
// Not counted: allocator caching and fragmentation (the CUDA caching allocator reserves more than
// it allocates; host malloc keeps freed pages), CUDA / cuDNN workspaces, the weight file's
// bytes while it is read (a std::string or a mapped file, outside ATen), small tensors
// (timesteps, modulation vectors), and host memory of a GPU run.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "pipeline/wan_pipeline.h"
#include "text/umt5.h"
#include "vision/clip_vision.h"
#include "vae/wan_vae.h"

namespace vidit {

struct SampleMemoryInputs {
  ModelConfig model;                       // the DiT
  text::Umt5Config text;                   // the text encoder's shape (default: umT5-XXL, Wan's)
  at::ScalarType text_dtype = at::kBFloat16;  // text.dtype
  WanVAEConfig vae;                        // the VAE (the pipeline builds Wan 2.1's)
  // Pixels per latent cell: 8 (Wan 2.1's VAE), 16 (Wan 2.2's: the denoised latent is counted at
  // its size; its decode is counted as Wan 2.1's decoder at that latent, an estimate).
  int64_t vae_stride = 8;
  int64_t frames = 81, width = 832, height = 480;
  // Real tokens of the prompt and of the negative prompt (EOS included, <= model.text_len);
  // 0: model.text_len, the most a caption can have.
  int64_t prompt_tokens = 0, negative_tokens = 0;
  bool cuda = false;                       // the phases run on CUDA (else the CPU)
  bool guidance = true;                    // sample.cfg_scale != 1: one batch-2 call per step
  bool unipc = false;                      // sample.solver = "unipc" (keeps two more latents)
  int64_t transformer_file_bytes = 4;      // bytes per parameter of the DiT file; 0: given in memory
  int64_t vae_file_bytes = 4;              // bytes per parameter of the VAE file
  // Image-to-video (model.condition): the pictures given (1, or 2 for first-and-last; 0 for
  // text-to-video: no image phase), and CLIP's shape where model.image_dim > 0.
  int64_t condition_pictures = 0;
  vision::ClipVisionConfig clip = vision::ClipVisionConfig::vit_h_14();
  bool tiled = false;                      // decode tiled (the pipeline: width or height > 512)
  VaeTiling tiling;                        // its tile and stride
  bool bf16_projections = false;           // sample.dtype = "bf16": the DiT's 2-D weights in bf16
  // The ranks of the job (sampling_ranks.h): their number, guidance on two halves, and the DiT's
  // degrees on each (tokens split over sp = ulysses x ring, weights over shard, heads and MLP
  // units over tensor). One process: 1, false, 1, 1, 1.
  int ranks = 1;
  bool halves = false;
  int64_t sp = 1, shard = 1, tensor = 1;
};

// What the pipeline runs for `request` with `cfg` on `device`: cfg.model, cfg.text.dtype,
// cfg.sample (guidance, solver), umT5-XXL's shape (text::Umt5Config's defaults) and Wan 2.1's
// VAE, tiled as generate_video tiles, captions at model.text_len tokens (the worst case).
// `ranks`: the job's size; the layout is sampling_layout()'s for it.
SampleMemoryInputs sample_memory_inputs(const Config& cfg, const VideoRequest& request, at::Device device, int ranks = 1,
                                        int64_t vae_stride = 8);

struct MemoryTerm {
  std::string name;
  int64_t bytes = 0;
};

struct PhaseMemory {
  std::string name;       // "text", "image" (image-to-video), "denoise", "decode"
  int64_t weights = 0;    // held from loading to the end of the phase
  int64_t loading = 0;    // held beside the weights for a moment while loading
  int64_t activations = 0;  // alive beside the weights at the busiest moment of running
  int64_t peak = 0;       // weights + max(loading, activations)
  std::string peak_at;    // "loading" or where running peaks
  std::vector<MemoryTerm> terms;  // every term counted, by name (weights, loading, running)
};

struct SampleMemory {
  std::vector<PhaseMemory> phases;  // text, image (image-to-video only), denoise, decode
  // The phase named `name`; throws vidit::Error when there is none.
  const PhaseMemory& phase(const std::string& name) const;
  int64_t peak = 0;                 // the largest phase's: what the run needs
  std::string peak_phase;
};

// Throws vidit::Error on a request check_video_request rejects.
SampleMemory predict_sample_memory(const SampleMemoryInputs& in);

// Parameters of a Wan VAE of `cfg` (built on the meta device, no memory).
int64_t count_vae_parameters(const WanVAEConfig& cfg);
// Bytes of umT5 weights of `cfg` held in `dtype` (norms fp32), as Umt5Encoder holds them.
int64_t umt5_weight_bytes(const text::Umt5Config& cfg, at::ScalarType dtype);

// A short table: phase, weights, loading, activations, peak; the phase that sets the run's peak;
// the guidance note.
std::string format_sample_memory(const SampleMemoryInputs& in, const SampleMemory& m);

}  // namespace vidit
