#include "model/model_info.h"

#include <cstdio>
#include <sstream>

namespace vidit {

int64_t count_block_parameters(const ModelConfig& m) {
  const int64_t d = m.dim;
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  const int64_t attn = 4 * linear(d, d) + 2 * d;  // q, k, v, o, norm_q, norm_k
  return 2 * attn + 2 * d /*norm3*/ + linear(d, m.ffn_dim) + linear(m.ffn_dim, d) + 6 * d /*modulation*/;
}

int64_t count_parameters(const ModelConfig& m) {
  const int64_t d = m.dim, p = m.patch[0] * m.patch[1] * m.patch[2];
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  int64_t n = m.in_channels * p * d + d;                        // patch_embedding
  n += linear(m.text_dim, d) + linear(d, d);                    // text_embedding.{0,2}
  n += linear(m.freq_dim, d) + linear(d, d);                    // time_embedding.{0,2}
  n += linear(d, 6 * d);                                        // time_projection.1
  n += m.layers * count_block_parameters(m);
  n += linear(d, m.out_channels * p) + 2 * d;                   // head.head, head.modulation
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
