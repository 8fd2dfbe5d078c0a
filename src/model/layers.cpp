#include "model/layers.h"

#include "kernels/layernorm_modulate.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/rmsnorm_cpu.h"
#include "model/param_storage.h"
#include "model/rope.h"

namespace vidit {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", new_parameter({out, in}, fill_kaiming_weight));
  if (with_bias) bias = register_parameter("bias", new_parameter({out}, fill_fan_in_bias(in)));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](at::Tensor& t) { t.fill_(1); }));
  bias = register_parameter("bias", new_parameter({dim}, [](at::Tensor& t) { t.zero_(); }));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, weight, bias, eps); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, [](at::Tensor& t) { t.fill_(1); }));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (!mean_square) return rmsnorm(fp32(x), fp32(weight), eps);
  at::Tensor xf = fp32(x);
  return xf * at::rsqrt(mean_square(xf) + eps) * fp32(weight);
}

at::Tensor project(const LinearFn& fn, Linear proj, const at::Tensor& x) {
  return fn ? fn(x, proj->weight, proj->bias) : proj->forward(x);
}

at::Tensor FeatureSplit::out(const Linear& proj, const at::Tensor& y, const LinearFn& fn) const {
  if (!combine) return project(fn, proj, y);
  return combine(fn ? fn(y, proj->weight, at::Tensor()) : at::linear(y, proj->weight)) + proj->bias;
}

at::Tensor layernorm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                              double eps) {
  // The kernel modulates per sample ([B, 1, D]); per token ([B, L, D]) takes the composition.
  const bool fusable = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                       shift.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat &&
                       shift.size(1) == 1 && scale.size(1) == 1;
  if (x.is_cuda() && fusable && layernorm_modulate_cuda_available())
    return layernorm_modulate_fused(x, shift, scale, eps);
  at::Tensor xf = fp32(x);
  return at::addcmul(shift, at::layer_norm(xf, {xf.size(-1)}, {}, {}, eps), 1 + scale);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  // SDPA wants [B, heads, L, hd]; on CUDA it picks flash / cuDNN / memory-efficient kernels.
  at::Tensor o = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2).to(q.scalar_type()));
  return o.transpose(1, 2).flatten(2);
}

SelfAttentionImpl::SelfAttentionImpl(int64_t dim, int64_t heads_, double eps) : heads(heads_) {
  q = register_module("q", Linear(dim, dim));
  k = register_module("k", Linear(dim, dim));
  v = register_module("v", Linear(dim, dim));
  o = register_module("o", Linear(dim, dim));
  norm_q = register_module("norm_q", RMSNorm(dim, eps));
  norm_k = register_module("norm_k", RMSNorm(dim, eps));
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                      const at::Tensor& sin) {
  const std::vector<at::Tensor> h = qkv(x, cos, sin);
  return out(attend(h[0], h[1], h[2]));
}

std::vector<at::Tensor> SelfAttentionImpl::qkv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), L = x.size(1);
  at::Tensor xs = split.in(x);
  auto heads_of = [&](const at::Tensor& t) { return t.view({B, L, heads, t.size(2) / heads}); };
  // On a GPU the norm and the rotation are one kernel (kernels/qk_norm_rope.h), unless the norm
  // spans ranks (tensor parallel: its mean square is a collective).
  auto norm_rope = [&](RMSNorm& norm, const at::Tensor& t) {
    if (!norm->mean_square && qk_norm_rope_applies(t, cos, sin, heads))
      return qk_norm_rope_fused(t, fp32(norm->weight), cos, sin, heads, norm->eps);
    return rope_apply(heads_of(norm(t)), cos, sin);
  };
  return {norm_rope(norm_q, project(linear_fn, q, xs)), norm_rope(norm_k, project(linear_fn, k, xs)),
          heads_of(project(linear_fn, v, xs))};
}

at::Tensor SelfAttentionImpl::attend(const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh) {
  return attention_fn ? attention_fn(qh, kh, vh) : attention(qh, kh, vh);
}

at::Tensor SelfAttentionImpl::out(const at::Tensor& a) { return split.out(o, a, linear_fn); }

CrossAttentionImpl::CrossAttentionImpl(int64_t dim, int64_t heads_, double eps, int64_t text_len_)
    : heads(heads_), text_len(text_len_) {
  q = register_module("q", Linear(dim, dim));
  k = register_module("k", Linear(dim, dim));
  v = register_module("v", Linear(dim, dim));
  o = register_module("o", Linear(dim, dim));
  norm_q = register_module("norm_q", RMSNorm(dim, eps));
  norm_k = register_module("norm_k", RMSNorm(dim, eps));
  if (text_len > 0) {
    k_img = register_module("k_img", Linear(dim, dim));
    v_img = register_module("v_img", Linear(dim, dim));
    norm_k_img = register_module("norm_k_img", RMSNorm(dim, eps));
  }
}

at::Tensor CrossAttentionImpl::forward(const at::Tensor& x, const at::Tensor& context) {
  const int64_t B = x.size(0), L = x.size(1);
  const int64_t Li = text_len > 0 ? context.size(1) - text_len : 0;
  TORCH_CHECK(Li > 0 || text_len == 0, "cross-attention of an image-to-video model: the context has ", context.size(1),
              " tokens, no image tokens before the ", text_len, " of the text");
  at::Tensor xs = split.in(x), cs = split.in(Li > 0 ? context.narrow(1, Li, text_len) : context);
  at::Tensor qh = norm_q(project(linear_fn, q, xs)), kh = norm_k(project(linear_fn, k, cs)),
             vh = project(linear_fn, v, cs);
  const int64_t hd = qh.size(2) / heads, Lc = cs.size(1);
  const at::Tensor qv = qh.view({B, L, heads, hd});
  at::Tensor a = attention(qv, kh.view({B, Lc, heads, hd}), vh.view({B, Lc, heads, hd}));
  if (Li > 0) {
    const at::Tensor is = split.in(context.narrow(1, 0, Li));
    const at::Tensor ki = norm_k_img(project(linear_fn, k_img, is)), vi = project(linear_fn, v_img, is);
    a = a + attention(qv, ki.view({B, Li, heads, hd}), vi.view({B, Li, heads, hd}));
  }
  return split.out(o, a, linear_fn);
}

}  // namespace vidit
