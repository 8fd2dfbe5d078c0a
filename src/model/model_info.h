// Analytic accounting of a DiT configuration, computed without allocating weights:
// parameter count, FLOPs of one training sample and training memory.
//
// FLOPs (multiply-add = 2 FLOPs), for L video tokens, Lt text tokens, d = dim, f = ffn_dim:
//   forward = patch 2*L*(C*pt*ph*pw)*d + text 2*Lt*(text_dim*d + d*d) + time 2*(freq*d + d*d + 6*d*d)
//           + layers * [ 2*L*4*d^2            (self-attn q, k, v, o)
//                      + 4*L^2*d              (self-attn scores QK^T and weighted sum AV)
//                      + 2*L*2*d^2 + 2*Lt*2*d^2 (cross-attn q, o on video; k, v on text)
//                      + 4*L*Lt*d             (cross-attn scores and sum)
//                      + 2*L*2*d*f ]          (MLP)
//           + head 2*L*d*(C_out*pt*ph*pw)
//   image-to-video (image_dim = di > 0, Li image tokens: 257, or image_pos_tokens):
//           + 2*Li*(di^2 + di*d) + layers * [ 2*Li*2*d^2 + 4*L*Li*d ]
//   training sample = 3 * forward (backward costs twice the forward).
// Norms, RoPE and elementwise work are left out (well under 1% at real sizes).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace vidit {

// Image tokens of one CLIP image (ViT-H/14 at 224: 16 x 16 patches and the class token).
inline constexpr int64_t kImageTokens = 257;

struct ModelInfo {
  int64_t params = 0;
  double forward_flops = 0;       // one sample
  double train_flops = 0;         // one sample, forward + backward
  int64_t tokens = 0;             // video tokens per sample
  double weight_bytes = 0;        // fp32 master weights
  double grad_bytes = 0;          // fp32 gradients
  double optimizer_bytes = 0;     // AdamW exp_avg + exp_avg_sq (fp32)
  double ema_bytes = 0;           // EMA copy (fp32) when enabled
};

// Every parameter's name (the official Wan 2.1 keys, as DiT registers them) and shape, in
// registration order: what `vidit plan` lays out without building the model. A test checks it
// against DiT's own parameters.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& m);
int64_t count_parameters(const ModelConfig& m);
int64_t count_block_parameters(const ModelConfig& m);  // one DiT block
ModelInfo model_info(const Config& c);
std::string format_info(const Config& c, const ModelInfo& info);

}  // namespace vidit
