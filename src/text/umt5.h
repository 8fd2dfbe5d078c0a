// The umT5 encoder (Wan 2.1's text encoder; Hugging Face's UMT5EncoderModel), inference only.
// A stack of pre-norm blocks on the token embeddings, then a final norm:
//   x = embed(ids)
//   per block:  x += o(attention(q, k, v of rms(x)))      scores q·kᵀ NOT scaled by 1/sqrt(d_kv),
//                                                        plus the block's own relative-position
//                                                        bias; padded keys left out (their
//                                                        softmax weight is exactly 0 anyway)
//               x += wo(act(wi_0(rms(x))) * wi_1(rms(x)))  (gated; act = gelu_new, the tanh GELU)
//   out = rms(x)
// rms is T5's norm: x / sqrt(mean(x²) + eps) * weight (no mean, no bias), always in fp32. The
// relative-position bias is T5's bidirectional bucketing (half the buckets for keys after the
// query; within each half, exact distances below num_buckets/4, log-spaced buckets up to
// max_distance, one bucket beyond). Unlike T5, every umT5 block has its own bias table.
//
// Precision: "fp32" computes everything in fp32 (equal to transformers' eager model to ~1e-6).
// "bf16" stores the projection weights and the embedding in bf16 and multiplies in bf16, while
// the residual stream and the norms stay in fp32.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/packed_linear.h"
#include "core/safetensors.h"

namespace vidit::text {

// The encoder's shape: Hugging Face's config.json names.
struct Umt5Config {
  int64_t vocab_size = 256384;
  int64_t d_model = 4096;
  int64_t d_kv = 64;          // per-head width of q, k, v
  int64_t d_ff = 10240;
  int64_t num_heads = 64;
  int64_t num_layers = 24;
  int64_t num_buckets = 32;   // relative_attention_num_buckets
  int64_t max_distance = 128; // relative_attention_max_distance
  double eps = 1e-6;          // layer_norm_epsilon
  std::string feed_forward_proj = "gated-gelu";  // [gated-]{gelu, gelu_new, relu, silu, ...}

  int64_t inner_dim() const { return num_heads * d_kv; }
  bool gated() const;        // feed_forward_proj starts with "gated-"
  std::string activation() const;  // the activation's Hugging Face name ("gated-gelu" means gelu_new)

  // Reads config.json; throws vidit::Error naming the file on a missing or malformed field.
  static Umt5Config from_json_file(const std::string& path);
};

// Buckets of T5's bidirectional relative-position bias for a [L, L] attention: int64 [L, L],
// entry (i, j) for query i and key j. The arithmetic (fp32 logarithms, truncation) is
// transformers' own, so the buckets match it exactly.
at::Tensor relative_position_buckets(int64_t L, int64_t num_buckets, int64_t max_distance, at::Device device);

class Umt5Encoder {
 public:
  // Builds the encoder from Hugging Face-named weights (see load_weights), checking every
  // tensor's presence and shape against `cfg`. `dtype`: at::kFloat or at::kBFloat16.
  Umt5Encoder(const Umt5Config& cfg, const TensorMap& hf_weights, at::ScalarType dtype, at::Device device,
              const std::string& source = "<weights>");

  // Opens `path`:
  //  - a Hugging Face / diffusers text_encoder folder: config.json, and model.safetensors or
  //    shards named by model.safetensors.index.json (its weight_map);
  //  - a diffusers pipeline root (its text_encoder/ is used);
  //  - a single .safetensors file with Hugging Face or Wan names (Wan's T5Encoder: token_embedding,
  //    blocks.N.attn.*, blocks.N.ffn.{gate.0,fc1,fc2}, blocks.N.pos_embedding, norm), its shape
  //    read from a config.json beside it or from the tensors' shapes;
  //  - Wan's models_t5_umt5-xxl-enc-bf16.pth (a torch.save'd state dict), read with LibTorch's
  //    unpickler; when that fails, an error gives the one-line conversion to safetensors.
  // Throws vidit::Error naming the file, and the key or tensor (expected and found shape).
  static Umt5Encoder load(const std::string& path, at::ScalarType dtype, at::Device device);

  // What forward() returns at padded positions: transformers' values (each padded position is a
  // query over the real keys too), or zeros, which skips the padded rows' work entirely (Wan's
  // text context keeps only the real tokens).
  enum class PaddedRows { computed, zeros };

  // ids: int64 [B, L]; mask: [B, L] (nonzero = real token; at least one per row, else
  // vidit::Error), any integer or bool dtype. Returns fp32 [B, L, d_model] on the encoder's device:
  // the final norm's output for every real position, and for padded ones as `padded` says. The
  // real positions' values do not depend on `padded`, nor on how much padding there is (up to
  // fp32 rounding). Runs without autograd.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask, PaddedRows padded = PaddedRows::computed) const;

  const Umt5Config& config() const { return cfg_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }

 private:
  struct Block {
    PackedLinear qkv;        // [3 * inner, d_model]: q, k, v stacked
    PackedLinear o;          // [d_model, inner]
    at::Tensor rel_bias;   // [num_heads, num_buckets] (compute dtype): the bias table, transposed
    at::Tensor norm_attn;  // [d_model] fp32
    PackedLinear wi;         // gated: [2 * d_ff, d_model] (wi_0 then wi_1); else [d_ff, d_model]
    PackedLinear wo;         // [d_model, d_ff]
    at::Tensor norm_ff;    // [d_model] fp32
  };
  at::Tensor ffn_act(const at::Tensor& x) const;

  Umt5Config cfg_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor embed_;       // [vocab, d_model]
  at::Tensor final_norm_;  // [d_model] fp32
  std::vector<Block> blocks_;
};

// Renames Wan's T5Encoder keys to Hugging Face's (others pass through unchanged).
std::string wan_key_to_hf(const std::string& key);

}  // namespace vidit::text
