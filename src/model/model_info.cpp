#include "model/model_info.h"

#include <cstdio>
#include <sstream>

namespace vidit {

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t d = m.dim, p = m.patch[0] * m.patch[1] * m.patch[2];
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { out.emplace_back(name, std::move(shape)); };
  auto linear = [&](const std::string& name, int64_t in, int64_t n_out) {
    add(name + ".weight", {n_out, in});
    add(name + ".bias", {n_out});
  };
  add("patch_embedding.weight", {d, m.in_channels, m.patch[0], m.patch[1], m.patch[2]});
  add("patch_embedding.bias", {d});
  linear("text_embedding.0", m.text_dim, d);
  linear("text_embedding.2", d, d);
  linear("time_embedding.0", m.freq_dim, d);
  linear("time_embedding.2", d, d);
  linear("time_projection.1", d, 6 * d);
  if (m.image_dim > 0) {  // image-to-video: the CLIP features' projection
    if (m.image_pos_tokens > 0) add("img_emb.emb_pos", {1, m.image_pos_tokens, m.image_dim});
    add("img_emb.proj.0.weight", {m.image_dim});
    add("img_emb.proj.0.bias", {m.image_dim});
    linear("img_emb.proj.1", m.image_dim, m.image_dim);
    linear("img_emb.proj.3", m.image_dim, d);
    add("img_emb.proj.4.weight", {d});
    add("img_emb.proj.4.bias", {d});
  }
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    add(b + "modulation", {1, 6, d});  // a module's own parameters come before its children's
    for (const char* attn : {"self_attn", "cross_attn"}) {
      for (const char* proj : {"q", "k", "v", "o"}) linear(b + attn + "." + proj, d, d);
      add(b + attn + ".norm_q.weight", {d});
      add(b + attn + ".norm_k.weight", {d});
      if (m.image_dim > 0 && std::string(attn) == "cross_attn") {  // the image tokens' keys and values
        linear(b + attn + ".k_img", d, d);
        linear(b + attn + ".v_img", d, d);
        add(b + attn + ".norm_k_img.weight", {d});
      }
    }
    add(b + "norm3.weight", {d});
    add(b + "norm3.bias", {d});
    linear(b + "ffn.0", d, m.ffn_dim);
    linear(b + "ffn.2", m.ffn_dim, d);
  }
  add("head.modulation", {1, 2, d});
  linear("head.head", d, m.out_channels * p);
  return out;
}

namespace {
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
}  // namespace

int64_t count_block_parameters(const ModelConfig& m) {
  ModelConfig one = m;
  one.layers = 1;
  int64_t n = 0;
  for (const auto& [name, shape] : parameter_shapes(one))
    if (name.rfind("blocks.", 0) == 0) n += numel_of(shape);
  return n;
}

int64_t count_parameters(const ModelConfig& m) {
  int64_t n = 0;
  for (const auto& [name, shape] : parameter_shapes(m)) n += numel_of(shape);
  return n;
}

ModelInfo model_info(const Config& c) {
  const auto& m = c.model;
  ModelInfo info;
  info.params = count_parameters(m);
  const double L = double(tokens_per_sample(c)), Lt = double(m.text_len), d = double(m.dim),
               f = double(m.ffn_dim), p = double(m.patch[0] * m.patch[1] * m.patch[2]);
  info.tokens = tokens_per_sample(c);
  double fw = 2 * L * (m.in_channels * p) * d + 2 * Lt * (m.text_dim * d + d * d) +
              2 * (m.freq_dim * d + d * d + 6 * d * d);
  double block = 2 * L * 4 * d * d + 4 * L * L * d + 2 * L * 2 * d * d + 2 * Lt * 2 * d * d +
                 4 * L * Lt * d + 2 * L * 2 * d * f;
  if (m.image_dim > 0) {  // image tokens: their projection once, their keys, values and attention per block
    const double Li = double(m.image_pos_tokens > 0 ? m.image_pos_tokens : kImageTokens), di = double(m.image_dim);
    fw += 2 * Li * (di * di + di * d);
    block += 2 * Li * 2 * d * d + 4 * L * Li * d;
  }
  fw += m.layers * block + 2 * L * d * (m.out_channels * p);
  info.forward_flops = fw;
  info.train_flops = 3 * fw;
  info.weight_bytes = 4.0 * info.params;
  info.grad_bytes = 4.0 * info.params;
  info.optimizer_bytes = 8.0 * info.params;
  info.ema_bytes = c.train.ema_decay > 0 ? 4.0 * info.params : 0;
  return info;
}

std::string format_info(const Config& c, const ModelInfo& i) {
  auto gib = [](double b) { return b / double(1ull << 30); };
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "config          %s\n"
                "parameters      %lld (%.3f B)\n"
                "latent/sample   %lld x %lld x %lld -> %lld tokens (text %lld tokens)\n"
                "FLOPs/sample    forward %.4g, training (fwd+bwd) %.4g  [%.2f TFLOP]\n"
                "memory (fp32)   weights %.3f GiB, grads %.3f GiB, AdamW %.3f GiB, EMA %.3f GiB,"
                " total %.3f GiB (activations extra)\n",
                c.source.c_str(), (long long)i.params, i.params / 1e9,
                (long long)c.data.latent_frames, (long long)c.data.latent_height,
                (long long)c.data.latent_width, (long long)i.tokens, (long long)c.model.text_len,
                i.forward_flops, i.train_flops, i.train_flops / 1e12, gib(i.weight_bytes),
                gib(i.grad_bytes), gib(i.optimizer_bytes), gib(i.ema_bytes),
                gib(i.weight_bytes + i.grad_bytes + i.optimizer_bytes + i.ema_bytes));
  return buf;
}

}  // namespace vidit
