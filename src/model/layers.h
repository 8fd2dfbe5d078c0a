// Small building blocks of the DiT: RMSNorm, LayerNorm + adaLN modulation, attention modules.
// Plain single-device modules; parameter names follow the official Wan 2.1 keys.
#pragma once
#include <functional>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace vidit {

// Promotes bf16/fp16 to fp32 and leaves fp32/fp64 alone: "computed in at least fp32".
inline at::Tensor fp32(const at::Tensor& x) {
  return at::isReducedFloatingType(x.scalar_type()) ? x.to(at::kFloat) : x;
}

// y = x W^T + b: W [out, in], b [out] (or none). Like Linear (the same default fill,
// drawn in the same order), but its parameters come from new_parameter() (model/param_storage.h),
// so the model can be described without memory.
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in, int64_t out, bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
};
TORCH_MODULE(Linear);

// LayerNorm over the last dim with a learned weight (ones) and bias (zeros), [dim] each.
struct LayerNormImpl : torch::nn::Module {
  LayerNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// RMSNorm over the last dim with a learned scale `weight` [dim]; computed in fp32.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
  // The mean of x^2 over the whole normalised vector, [..., 1]. Empty: over x's last dim (one
  // fused kernel). Set when the vector's features are split over processes (FeatureSplit).
  std::function<at::Tensor(const at::Tensor& x)> mean_square;
};
TORCH_MODULE(RMSNorm);

// y = LayerNorm(x) * (1 + scale) + shift with no LayerNorm affine; x [B, L, D],
// shift/scale [B, 1, D] (or [B, L, D]: per token); fp32 out. Uses the fused CUDA kernel on CUDA
// tensors of per-sample modulation when built with it (kernels/layernorm_modulate.h), the ATen
// composition elsewhere.
at::Tensor layernorm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                              double eps);

// How the projections inside the blocks multiply: y = x W^T + b (b may be undefined). Empty:
// at::linear, under whatever autocast is on. FP8 training installs one (model/fp8.h); the model
// only calls it.
using LinearFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias)>;

// proj(x) through `fn` when one is set.
at::Tensor project(const LinearFn& fn, Linear proj, const at::Tensor& x);

// How a run that splits each layer's features (attention heads, MLP hidden units) over
// processes plugs into the model (parallel/tensor_parallel.h); the model only calls these, and in
// one process none is set. Projections into split features (q, k, v, the first MLP layer) hold
// only this process's output rows; projections out of them (o, the second MLP layer) hold only
// its input columns.
struct FeatureSplit {
  // The input of projections into split features (identity; backward adds up the members'
  // gradients, since each member's split features depend on the whole input).
  std::function<at::Tensor(const at::Tensor&)> enter;
  // Adds up the members' partial outputs of a projection out of split features (backward:
  // identity, every member continues with the same sum).
  std::function<at::Tensor(const at::Tensor&)> combine;

  at::Tensor in(const at::Tensor& x) const { return enter ? enter(x) : x; }
  // out(y): the bias is added once, after the partial products are summed.
  at::Tensor out(const Linear& proj, const at::Tensor& y, const LinearFn& fn = {}) const;
};

// Scaled dot-product attention over [B, L, heads, head_dim] tensors (returns [B, Lq, heads*hd]).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Any function with attention()'s contract. A run that splits tokens over processes replaces
// the self-attention's with one that exchanges them (parallel/sequence_parallel.h).
using AttentionFn = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// Self-attention with QK RMSNorm (over the full dim) and 3D RoPE.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t dim, int64_t heads, double eps);
  // x [B, L, dim]; cos/sin [L, head_dim/2] from rope_tables(). forward = out(attend(qkv(...))).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  // q, k, v [B, L, heads, head_dim]: projected, q and k normalised and rotated.
  std::vector<at::Tensor> qkv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);  // [B, L, heads*hd]
  at::Tensor out(const at::Tensor& a);  // the output projection
  int64_t heads;             // in this process (all of them unless split)
  AttentionFn attention_fn;  // empty: attention()
  FeatureSplit split;        // empty: every head in this process
  LinearFn linear_fn;        // empty: at::linear
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
};
TORCH_MODULE(SelfAttention);

// Cross-attention from video tokens to text tokens, QK RMSNorm, no RoPE. An image-to-video model
// (`text_len` > 0) also attends to image tokens placed before the text in the context: their own
// keys and values (k_img, v_img; the keys RMS-normalised by norm_k_img), the same queries, the two
// attentions' outputs added before the output projection (Wan 2.1 I2V).
struct CrossAttentionImpl : torch::nn::Module {
  // text_len: 0 for text alone; otherwise the text's token count, the context's last tokens.
  CrossAttentionImpl(int64_t dim, int64_t heads, double eps, int64_t text_len = 0);
  // x [B, L, dim], context [B, Limage + Ltext, dim] (Limage = 0 without image projections)
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context);
  int64_t heads;       // in this process
  int64_t text_len;    // > 0: the model attends to image tokens too
  FeatureSplit split;  // empty: every head in this process
  LinearFn linear_fn;  // empty: at::linear
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
  Linear k_img{nullptr}, v_img{nullptr};  // image-to-video only
  RMSNorm norm_k_img{nullptr};
};
TORCH_MODULE(CrossAttention);

}  // namespace vidit
