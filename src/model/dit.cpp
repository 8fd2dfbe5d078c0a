#include "model/dit.h"

#include <torch/nn/modules/activation.h>

#include "core/error.h"
#include "core/trace.h"
#include "kernels/residual_layernorm.h"
#include "core/unallocated.h"
#include "model/init.h"
#include "model/param_storage.h"
#include "model/recompute.h"
#include "model/rope.h"

namespace vidit {
namespace nn = torch::nn;

at::Tensor sinusoidal_embedding(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  at::Tensor f = at::pow(10000.0, -at::arange(half, t.options().dtype(at::kDouble)) / double(half));
  at::Tensor args = at::outer(t.to(at::kDouble), f);
  return at::cat({at::cos(args), at::sin(args)}, 1).to(at::kFloat);
}

DiTBlockImpl::DiTBlockImpl(const ModelConfig& c) : eps(c.eps) {
  self_attn = register_module("self_attn", SelfAttention(c.dim, c.heads, c.eps));
  cross_attn = register_module("cross_attn", CrossAttention(c.dim, c.heads, c.eps, c.image_dim > 0 ? c.text_len : 0));
  norm3 = register_module("norm3", LayerNorm(c.dim, c.eps));
  fc1 = Linear(c.dim, c.ffn_dim);
  fc2 = Linear(c.ffn_dim, c.dim);
  ffn = register_module("ffn", nn::Sequential(fc1, nn::GELU(nn::GELUOptions().approximate("tanh")), fc2));
  modulation = register_parameter("modulation", new_parameter({1, 6, c.dim}, [](at::Tensor& t) { t.zero_(); }));
}

at::Tensor DiTBlockImpl::forward(const at::Tensor& x_in, const at::Tensor& e0,
                                 const at::Tensor& context, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  const at::Tensor e = modulated(e0);
  const std::vector<at::Tensor> h = attention_inputs(x_in, e, cos, sin);
  return after_attention(x_in, e, self_attn->attend(h[0], h[1], h[2]), context);
}

at::Tensor DiTBlockImpl::modulated(const at::Tensor& e0) { return fp32(modulation) + e0; }

namespace {
// The six parts of a block's modulation e: shift, scale, gate (attention) then shift, scale,
// gate (MLP); each [B, 1, dim] fp32 from e [B, 6, dim] (a timestep per sample), or [B, L, dim]
// from e [B, L, 6, dim] (a timestep per token).
std::vector<at::Tensor> modulation_parts(const at::Tensor& e) {
  if (e.dim() == 3) return e.chunk(6, 1);
  std::vector<at::Tensor> parts = e.chunk(6, 2);
  for (at::Tensor& p : parts) p = p.squeeze(2);
  return parts;
}
}  // namespace

std::vector<at::Tensor> DiTBlockImpl::attention_inputs(const at::Tensor& x, const at::Tensor& e0,
                                                       const at::Tensor& cos, const at::Tensor& sin) {
  auto e = modulation_parts(e0);
  return self_attn->qkv(layernorm_modulate(x, e[0], e[1], eps), cos, sin);
}

namespace {
// On a GPU a residual sum and the LayerNorm after it are one kernel (kernels/residual_layernorm.h).
bool fuses_residual_norm(const at::Tensor& x, const at::Tensor& y) {
  return x.is_cuda() && x.scalar_type() == at::kFloat &&
         (y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16) && residual_layernorm_cuda_available();
}
}  // namespace

at::Tensor DiTBlockImpl::after_attention(const at::Tensor& x_in, const at::Tensor& e0, const at::Tensor& a,
                                         const at::Tensor& context) {
  auto e = modulation_parts(e0);
  // The fused kernels modulate per sample; a timestep per token takes the ATen composition.
  const bool per_sample = e0.dim() == 3;
  // x + attention * gate, then norm3 (a LayerNorm with weight and bias) for cross-attention.
  const at::Tensor attended = self_attn->out(a);
  at::Tensor x, normed;
  if (per_sample && fuses_residual_norm(x_in, attended)) {
    ResidualNorm r = residual_layernorm_fused(x_in, attended, e[2], fp32(norm3->weight), fp32(norm3->bias), {}, {}, eps);
    x = r.residual, normed = r.out;
  } else {
    // addcmul promotes the bf16 product to fp32 in its kernel (the same values as fp32(attended)),
    // and keeps the bf16 tensor for backward: half the bytes of an fp32 copy.
    x = at::addcmul(x_in, attended, e[2]);
    normed = norm3(x);
  }
  // x + cross-attention, then LayerNorm + modulate for the MLP.
  const at::Tensor crossed = cross_attn->forward(normed, context);
  at::Tensor modulated_x;
  if (per_sample && fuses_residual_norm(x, crossed)) {
    ResidualNorm r = residual_layernorm_fused(x, crossed, {}, {}, {}, e[3], e[4], eps);
    x = r.residual, modulated_x = r.out;
  } else {
    x = x + fp32(crossed);
    modulated_x = layernorm_modulate(x, e[3], e[4], eps);
  }
  return at::addcmul(x, mlp(modulated_x), e[5]);
}

at::Tensor DiTBlockImpl::mlp(const at::Tensor& x) {
  return ffn_split.out(fc2, at::gelu(project(linear_fn, fc1, ffn_split.in(x)), "tanh"), linear_fn);
}

PatchEmbeddingImpl::PatchEmbeddingImpl(int64_t in_channels, int64_t dim, std::array<int64_t, 3> p) : patch(p) {
  const int64_t fan_in = in_channels * p[0] * p[1] * p[2];
  weight = register_parameter("weight", new_parameter({dim, in_channels, p[0], p[1], p[2]}, fill_kaiming_weight));
  bias = register_parameter("bias", new_parameter({dim}, fill_fan_in_bias(fan_in)));
}

at::Tensor PatchEmbeddingImpl::forward(const at::Tensor& x) {
  return at::conv3d(x, weight, bias, {patch[0], patch[1], patch[2]});
}

// LayerNorms of PyTorch's default epsilon (1e-5), as Wan's image embedding has them.
ImageEmbeddingImpl::ImageEmbeddingImpl(const ModelConfig& c) {
  proj = register_module("proj", nn::Sequential(LayerNorm(c.image_dim, 1e-5), Linear(c.image_dim, c.image_dim),
                                                nn::GELU(), Linear(c.image_dim, c.dim), LayerNorm(c.dim, 1e-5)));
  if (c.image_pos_tokens > 0)
    emb_pos = register_parameter("emb_pos", new_parameter({1, c.image_pos_tokens, c.image_dim},
                                                          [](at::Tensor& t) { t.zero_(); }));
}

at::Tensor ImageEmbeddingImpl::forward(const at::Tensor& image) {
  at::Tensor x = fp32(image);
  if (emb_pos.defined()) {
    VIDIT_CHECK(x.size(1) == emb_pos.size(1), "DiT: this model's image embedding takes ", emb_pos.size(1),
                " image tokens (model.image_pos_tokens: the first and last frames' features, one after the "
                "other), got ", x.size(1));
    x = x + fp32(emb_pos);
  }
  return fp32(proj->forward(x));
}

HeadImpl::HeadImpl(const ModelConfig& c) : eps(c.eps) {
  head = register_module("head", Linear(c.dim, c.out_channels * c.patch[0] * c.patch[1] * c.patch[2]));
  modulation = register_parameter("modulation", new_parameter({1, 2, c.dim}, [](at::Tensor& t) { t.zero_(); }));
}

at::Tensor HeadImpl::forward(const at::Tensor& x, const at::Tensor& e) {
  // shift, scale: [B, 1, dim] for e [B, dim]; [B, L, dim] for e [B, L, dim] (a timestep per token)
  auto m = (fp32(modulation) + fp32(e).unsqueeze(-2)).chunk(2, -2);
  if (e.dim() == 3) m[0] = m[0].squeeze(-2), m[1] = m[1].squeeze(-2);
  return fp32(head(layernorm_modulate(x, m[0], m[1], eps)));
}

DiTImpl::DiTImpl(const ModelConfig& c) : cfg(c) {
  patch_embedding =
      register_module("patch_embedding", PatchEmbedding(c.in_channels, c.dim, std::array<int64_t, 3>{c.patch[0], c.patch[1], c.patch[2]}));
  text_embedding = register_module(
      "text_embedding",
      nn::Sequential(Linear(c.text_dim, c.dim), nn::GELU(nn::GELUOptions().approximate("tanh")), Linear(c.dim, c.dim)));
  time_embedding =
      register_module("time_embedding", nn::Sequential(Linear(c.freq_dim, c.dim), nn::SiLU(), Linear(c.dim, c.dim)));
  time_projection = register_module("time_projection", nn::Sequential(nn::SiLU(), Linear(c.dim, 6 * c.dim)));
  if (c.image_dim > 0) img_emb = register_module("img_emb", ImageEmbedding(c));
  blocks = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(DiTBlock(c));
  head = register_module("head", Head(c));
}

void DiTImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard ng;
  for (auto& item : named_parameters(true)) {
    const at::Tensor& p = item.value();
    allocate(p);
    fill_initial(p.variable_data(), wan_init_rule(item.key(), p.sizes(), cfg), seed, item.key(), whole_region(p.sizes()));
  }
}

void DiTImpl::init_weights() { init_weights(uint64_t(at::randint(int64_t(1) << 62, {1}, at::kLong).item<int64_t>())); }

DiT dit_without_storage(const ModelConfig& cfg, at::Device device) {
  const BuildWithoutStorage without_storage(device);
  return DiT(cfg);
}

at::Tensor DiTImpl::forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& text, const at::Tensor& image) {
  const auto& c = cfg;
  VIDIT_CHECK(x.dim() == 5 && x.size(1) == c.in_channels, "DiT: latents must be [B, ", c.in_channels,
              ", T, H, W], got ", x.sizes());
  VIDIT_CHECK(x.size(2) % c.patch[0] == 0 && x.size(3) % c.patch[1] == 0 && x.size(4) % c.patch[2] == 0,
              "DiT: latent size ", x.sizes(), " is not divisible by the patch");
  VIDIT_CHECK(text.dim() == 3 && text.size(0) == x.size(0) && text.size(2) == c.text_dim &&
                  text.size(1) <= c.text_len,
              "DiT: text must be [B, <=", c.text_len, ", ", c.text_dim, "], got ", text.sizes());
  const int64_t B = x.size(0), f = x.size(2) / c.patch[0], h = x.size(3) / c.patch[1],
                w = x.size(4) / c.patch[2];
  if (hooks.model_begin) hooks.model_begin();

  // Contiguous: elementwise ops keep their inputs' layout, so a transposed stream would stay
  // transposed through every block (and each LayerNorm would copy it).
  at::Tensor tokens = fp32(patch_embedding(x).flatten(2).transpose(1, 2)).contiguous();  // [B, L, dim]
  const auto real = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // A timestep per sample [B], or per token [B, L] (Wan 2.2 TI2V: its first frame's at 0): e and
  // e0 then hold a row per token, [B, L, dim] and [B, L, 6, dim].
  const int64_t L = f * h * w;
  const bool per_token = t.dim() == 2;
  VIDIT_CHECK((t.dim() == 1 && t.size(0) == B) || (per_token && t.size(0) == B && t.size(1) == L), "DiT: timesteps "
              "must be [", B, "] (one per sample) or [", B, ", ", L, "] (one per token), got ", t.sizes());
  at::Tensor e = fp32(time_embedding->forward(sinusoidal_embedding(t.flatten(), c.freq_dim).to(x.device(), real)));
  at::Tensor e0 = fp32(time_projection->forward(e)).unflatten(1, {6, c.dim});
  if (per_token) e = e.unflatten(0, {B, L}), e0 = e0.unflatten(0, {B, L});
  at::Tensor padded = at::constant_pad_nd(text, {0, 0, 0, c.text_len - text.size(1)});
  at::Tensor context = text_embedding->forward(padded);
  VIDIT_CHECK(image.defined() == (c.image_dim > 0), "DiT: ",
              c.image_dim > 0 ? "an image-to-video model (model.image_dim > 0) needs the image's CLIP features"
                              : "image features given to a text-to-video model (model.image_dim = 0)");
  if (image.defined()) {
    VIDIT_CHECK(image.dim() == 3 && image.size(0) == B && image.size(2) == c.image_dim, "DiT: image features must be [",
                B, ", tokens, ", c.image_dim, "], got ", image.sizes());
    context = at::cat({img_emb->forward(image).to(context.scalar_type()), context}, 1);
  }
  auto [cos, sin] = rope_tables(f, h, w, c.dim / c.heads, c.rope_theta, x.device());
  if (token_split.scatter) {
    tokens = token_split.scatter(tokens, 1);
    cos = token_split.scatter(cos, 0), sin = token_split.scatter(sin, 0);
    if (per_token) e = token_split.scatter(e, 1), e0 = token_split.scatter(e0, 1);
  }

  const int64_t n = int64_t(blocks->size());
  const int64_t whole = recompute_blocks < 0 ? n : std::min(recompute_blocks, n);
  const int64_t selective = selective_blocks < 0 ? n - whole : std::min(selective_blocks, n - whole);
  const bool grad = at::GradMode::is_enabled();
  // A recomputed block joins the graph through its inputs only (its weights are used inside the
  // rerun), so when the embeddings are frozen (a LoRA fine-tune, model/lora.h) the stream must
  // still ask for a gradient, or the blocks' own trainable tensors would get none.
  if (grad && whole + selective > 0 && !tokens.requires_grad()) tokens = tokens.detach().requires_grad_();
  for (int64_t i = 0; i < n; ++i) {
    const trace::Annotation annotation("block", i);  // in a profile of the run (diagnose/profile.h)
    if (hooks.block_begin) hooks.block_begin(i);
    DiTBlockImpl& block = *blocks[i]->as<DiTBlockImpl>();
    tokens = grad && i < whole               ? recomputed_block(block, tokens, e0, context, cos, sin)
             : grad && i < whole + selective ? selectively_recomputed_block(block, tokens, e0, context, cos, sin)
                                             : block.forward(tokens, e0, context, cos, sin);
    if (hooks.block_end) tokens = hooks.block_end(i, tokens);
  }
  at::Tensor out = head(tokens, e);  // [B, L, pt*ph*pw*C]
  if (token_split.gather) out = token_split.gather(out);

  // unpatchify: [B, f, h, w, pt, ph, pw, C] -> [B, C, f*pt, h*ph, w*pw]
  out = out.view({B, f, h, w, c.patch[0], c.patch[1], c.patch[2], c.out_channels});
  out = out.permute({0, 7, 1, 4, 2, 5, 3, 6});
  out = out.reshape({B, c.out_channels, f * c.patch[0], h * c.patch[1], w * c.patch[2]});
  return hooks.model_end ? hooks.model_end(out) : out;
}

}  // namespace vidit
