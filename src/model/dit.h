// The video Diffusion Transformer (Wan 2.1 layout). Single-device, no parallelism inside.
//
//   latents x [B, C, T, H, W] --Conv3d patch (pt,ph,pw)--> tokens [B, L, dim], L = T/pt*H/ph*W/pw
//   timestep t [B] (sigma*1000) --sinusoid(freq_dim)--> time_embedding --> e [B, dim]
//                                 time_projection(e) --> e0 [B, 6, dim]  (shared adaLN)
//     or a timestep per token, t [B, L] (Wan 2.2 TI2V: 0 on the kept first frame's tokens):
//     e [B, L, dim], e0 [B, L, 6, dim], every modulation per token
//   text [B, <=text_len, text_dim] --zero-pad--> text_embedding --> context [B, text_len, dim]
//   image-to-video (image_dim > 0): CLIP features [B, Li, image_dim] --img_emb--> [B, Li, dim],
//     placed before the text in the context (each block's cross-attention attends to both);
//     x then holds 36 channels: the noisy latent, the condition mask and the condition's latent
//   blocks: self-attn (modulated, gated) -> cross-attn -> MLP (modulated, gated)
//   head: LayerNorm, modulate by head.modulation + e, Linear --> unpatchify [B, C_out, T, H, W]
//
// Parameter names equal the official Wan 2.1 keys (see state_dict.h).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include "core/config.h"
#include "model/layers.h"

namespace vidit {

struct DiTBlockImpl : torch::nn::Module {
  DiTBlockImpl(const ModelConfig& cfg);
  // x [B, L, dim] fp32 residual stream; e0 [B, 6, dim] (or [B, L, 6, dim]: per token) fp32;
  // context [B, Lt, dim].
  // forward = after_attention(x, e, self_attn->attend(attention_inputs(x, e, ...)), context) with
  // e = modulated(e0): the three parts model/recompute.h's selective policy takes apart.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& e0, const at::Tensor& context,
                     const at::Tensor& cos, const at::Tensor& sin);
  at::Tensor modulated(const at::Tensor& e0);  // this block's shift, scale, gate x 2: like e0
  std::vector<at::Tensor> attention_inputs(const at::Tensor& x, const at::Tensor& e, const at::Tensor& cos,
                                           const at::Tensor& sin);
  at::Tensor after_attention(const at::Tensor& x, const at::Tensor& e, const at::Tensor& a, const at::Tensor& context);
  double eps;
  SelfAttention self_attn{nullptr};
  CrossAttention cross_attn{nullptr};
  LayerNorm norm3{nullptr};
  // The MLP: Linear fc1 (dim -> ffn_dim), GELU-tanh, Linear fc2 (ffn_dim -> dim); registered
  // as the Sequential "ffn" (keys ffn.0, ffn.2), called through fc1 / fc2.
  at::Tensor mlp(const at::Tensor& x);
  torch::nn::Sequential ffn{nullptr};
  Linear fc1{nullptr}, fc2{nullptr};
  FeatureSplit ffn_split;  // empty: every MLP hidden unit in this process
  LinearFn linear_fn;      // the MLP's projections; empty: at::linear
  at::Tensor modulation;  // [1, 6, dim]
};
TORCH_MODULE(DiTBlock);

// The patch embedding: a Conv3d with kernel = stride = the patch, weight [dim, C_in, pt, ph, pw],
// bias [dim] (LibTorch's Conv3d default fill, in its order; parameters from new_parameter()).
struct PatchEmbeddingImpl : torch::nn::Module {
  PatchEmbeddingImpl(int64_t in_channels, int64_t dim, std::array<int64_t, 3> patch);
  at::Tensor forward(const at::Tensor& x);  // [B, C_in, T, H, W] -> [B, dim, T/pt, H/ph, W/pw]
  at::Tensor weight, bias;
  std::array<int64_t, 3> patch;
};
TORCH_MODULE(PatchEmbedding);

// Image-to-video: CLIP image features [B, Li, image_dim] -> context tokens [B, Li, dim]:
// LayerNorm, Linear, GELU, Linear, LayerNorm (registered as the Sequential "proj": keys proj.0,
// proj.1, proj.3, proj.4, Wan's), after a learned position embedding `emb_pos` [1, Li, image_dim]
// when image_pos_tokens is set (first-and-last-frame models).
struct ImageEmbeddingImpl : torch::nn::Module {
  explicit ImageEmbeddingImpl(const ModelConfig& cfg);
  at::Tensor forward(const at::Tensor& image);
  torch::nn::Sequential proj{nullptr};
  at::Tensor emb_pos;  // undefined without image_pos_tokens
};
TORCH_MODULE(ImageEmbedding);

struct HeadImpl : torch::nn::Module {
  HeadImpl(const ModelConfig& cfg);
  // x [B, L, dim], e [B, dim] or [B, L, dim] (per token) -> [B, L, out_channels * pt * ph * pw]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& e);
  double eps;
  Linear head{nullptr};
  at::Tensor modulation;  // [1, 2, dim]
};
TORCH_MODULE(Head);

// How a run that splits each sample's tokens over processes plugs into the model
// (parallel/sequence_parallel.h); the model only calls these. scatter(t, dim) keeps this process's
// part of the token axis `dim` of t (the tokens after the patch embedding, and the RoPE tables);
// gather(t) reassembles the whole token axis (dim 1) of the head's output before unpatchify.
struct TokenSplit {
  std::function<at::Tensor(const at::Tensor&, int64_t dim)> scatter;
  std::function<at::Tensor(const at::Tensor&)> gather;
};

// Called around the forward pass and each block (e.g. to gather sharded parameters just before
// they are used, parallel/fsdp.h); the model only calls them. block_end may wrap the block's output
// (to hook its backward) and returns what the next block reads; model_end likewise gets the
// prediction [B, C, T, H, W] and returns what forward() returns (the trainer's fault injection
// wraps it there, train/step_faults.h).
struct ForwardHooks {
  std::function<void()> model_begin;
  std::function<void(int64_t block)> block_begin;
  std::function<at::Tensor(int64_t block, const at::Tensor& out)> block_end;
  std::function<at::Tensor(const at::Tensor& out)> model_end;
};

struct DiTImpl : torch::nn::Module {
  explicit DiTImpl(const ModelConfig& cfg);
  // x [B, C_in, T, H, W]; t [B] timesteps in [0, 1000], or [B, L] one per token (L = the tokens
  // of x, in the order of the patch embedding's flattening); text [B, Lt <= text_len, text_dim];
  // image [B, Li, image_dim] CLIP features (image-to-video models only; Li = image_pos_tokens
  // when that is set).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& text, const at::Tensor& image = {});
  // Wan's initialisation (model/init.h): every parameter from `seed` alone, so that a rank that
  // initialises only its part of a parameter (parallel/parallel_model.h) gets exactly the values
  // these give. Without a seed, one is drawn from the global torch generator (seed it first).
  void init_weights(uint64_t seed);
  void init_weights();

  ModelConfig cfg;
  PatchEmbedding patch_embedding{nullptr};
  torch::nn::Sequential text_embedding{nullptr}, time_embedding{nullptr}, time_projection{nullptr};
  ImageEmbedding img_emb{nullptr};  // image-to-video only
  torch::nn::ModuleList blocks{nullptr};
  Head head{nullptr};
  TokenSplit token_split;  // empty: every token in this process
  ForwardHooks hooks;      // empty: none
  // Blocks whose activations are recomputed in backward instead of kept (model/recompute.h),
  // only when gradients are being recorded: the first `recompute_blocks` whole (their forward
  // runs again), the next `selective_blocks` selectively (attention kept); -1: all the rest.
  int64_t recompute_blocks = 0;
  int64_t selective_blocks = 0;
};
TORCH_MODULE(DiT);

// The DiT's parameters as shapes on `device` with no memory (model/param_storage.h): what
// parallelize() cuts before each rank fills its part (ParallelModel::init_parts), and what
// load_state_dict() fills a tensor at a time (straight onto the device, without a first copy on the
// host), or init_weights(seed) fills whole.
DiT dit_without_storage(const ModelConfig& cfg, at::Device device);

// Sinusoidal embedding of t [B] into [B, dim]: cat(cos(t*f), sin(t*f)), f_j = 10000^(-j/(dim/2)).
at::Tensor sinusoidal_embedding(const at::Tensor& t, int64_t dim);

}  // namespace vidit
