// FP8 training of the blocks' projections (train.precision = "fp8" or "fp8_rowwise").
//
// Every projection y = x W^T + b inside a DiT block (self- and cross-attention q, k, v, o; the
// MLP's two layers: nearly all of a block's matmul FLOPs) multiplies in FP8 on tensor cores:
//   forward   x and W are scaled so that their largest magnitude lands on e4m3's 448 and cast
//             to e4m3. "fp8": one scale per tensor; "fp8_rowwise": one per row of x (a token)
//             and per row of W (an output feature), which an outlier token or feature cannot
//             spoil for the rest. y = _scaled_mm(x8, W8^T) x the scales, in bf16, then + b;
//             train.fp8_fast_accum lets the tensor cores accumulate this product in their fast
//             mode (the gradients' products never do: their sums are longer).
//   backward  the incoming gradient dy is cast to e5m2 (max 57344: the range gradients need,
//             with fewer mantissa bits) with one scale per tensor, and
//               dx = dy W    from the forward's e4m3 W (recast from W, or the copy FSDP
//                            gathered). The scales of a scaled matmul lie along its output's rows
//                            and columns, never along the summed dimension, so in the rowwise
//                            recipe W's per-row scales s go onto dy instead: dy W = (dy s^T) W8,
//                            with dy s^T cast to e5m2 with one scale (W is quantised once);
//               dW = dy^T x  from the e4m3 copy of x the forward kept (1 byte a value, not the
//                            2 or 4 of x), re-scaled to one scale per tensor in the rowwise
//                            recipe for the same reason; tokens padded with zero rows to a
//                            multiple of 16;
//               db = sum dy  from dy as it came.
// What stays as in bf16 (the rule): the fp32 master weights and the optimizer, the norms,
// modulation, RoPE, attention and the residual stream; every projection outside the blocks (the
// patch embedding, the text and time embeddings, the time projection, the head: the first and
// last layers, and small ones, where FP8's error costs most and saves least); and a projection
// whose input or output width is not a multiple of 16 (what FP8 tensor cores take), such as a
// narrow tensor-parallel shard.
//
// The same calls run on the CPU (ATen has a CPU _scaled_mm), so the numerics are tested here;
// fp8_linear_reference is the recipe written out with dequantised fp64 matmuls.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <unordered_map>

#include "core/config.h"
#include "model/dit.h"

namespace vidit {

inline constexpr double kE4M3Max = 448.0, kE5M2Max = 57344.0;

// A tensor cast to FP8 with its scales: value ~= data * scale (`scale`: one element, or [rows, 1]).
struct Fp8Tensor {
  at::Tensor data, scale;
};
// t [rows, cols] in `dtype` (kFloat8_e4m3fn or kFloat8_e5m2) with one scale, or one per row.
Fp8Tensor to_fp8(const at::Tensor& t, at::ScalarType dtype, bool rowwise);
// Back to fp32 (data * scale).
at::Tensor from_fp8(const Fp8Tensor& t);
// The two halves of to_fp8, for code that finds the largest magnitude elsewhere (FSDP agrees
// on it across the shards of a weight): the scale for a largest magnitude `amax`, and
// t / scale cast to `dtype`. to_fp8(t) is fp8_cast(t, fp8_scale(amax of t)).
at::Tensor fp8_scale(const at::Tensor& amax, at::ScalarType dtype);
at::Tensor fp8_cast(const at::Tensor& t, const at::Tensor& scale, at::ScalarType dtype);

// The casts fp8_linear reuses (train.fp8_reuse_casts). Casting is not free: each cast reads its
// tensor several times and writes it twice, and unreused a weight is cast at every use (each
// micro-batch, the recomputed forward, backward) and an input once per projection that reads it.
//   weights  (when `weights`) a weight's cast is made at its first use and read by every later
//            one until clear(): held meanwhile, 1 byte a weight. Its owner clears it whenever the
//            weights may have changed (the trainer: before each step and after its update).
//            Not for weights whose memory FSDP frees between uses.
//   inputs   the last input's cast is read again while the same tensor, unchanged, comes next:
//            q, k and v of self-attention read one input, k and v of cross-attention another.
// The result is bitwise that of casting at every use.
class Fp8Casts {
 public:
  explicit Fp8Casts(bool weights = true) : weights_(weights) {}
  // True when weights' casts are kept (fp8_linear asks weight() only then).
  bool keeps_weights() const { return weights_; }
  // W [out, in] in e4m3 with the recipe's scales, kept from its first use.
  Fp8Tensor weight(const at::Tensor& w, bool rowwise);
  // x2 [rows, in] (the rows of `x`, the projection's input) in e4m3.
  Fp8Tensor input(const at::Tensor& x, const at::Tensor& x2, bool rowwise);
  void clear();
  // Casts made and casts read again, since construction.
  int64_t weight_casts = 0, weight_reuses = 0, input_casts = 0, input_reuses = 0;

 private:
  bool weights_;
  struct Kept {
    at::Tensor weight;  // keeps the key alive
    bool rowwise;
    Fp8Tensor cast;
  };
  std::unordered_map<const c10::TensorImpl*, Kept> weights_kept_;
  // The last input: held weakly (a freed input is never mistaken for a new one at its address).
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> last_input_;
  uint32_t last_version_ = 0;
  const void* last_data_ = nullptr;
  bool last_rowwise_ = false;
  Fp8Tensor last_cast_;
};

// y = x W^T + b in FP8 with autograd (x [..., in], W [out, in], b [out] or undefined); bf16 out.
// Falls back to at::linear when a width is not a multiple of 16. `w8`, when given, is W already
// in e4m3 with the recipe's scales (FSDP's gathered copy): W's own values are then never read,
// only its shape and dtype, and its gradient is still W's. `casts`: what may be reused (W's cast
// when no `w8` is given, x's).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool rowwise,
                      bool fast_accum = false, const Fp8Tensor* w8 = nullptr, Fp8Casts* casts = nullptr);
// True for the precisions whose blocks' projections multiply in FP8 ("fp8", "fp8_rowwise").
inline bool uses_fp8(Precision p) { return p == Precision::fp8 || p == Precision::fp8_rowwise; }
// True when fp8_linear multiplies x [..., in] by W [out, in] in FP8.
bool fp8_eligible(int64_t in, int64_t out);
// True for the name of a weight apply_fp8 routes through fp8_linear ("blocks.3.ffn.0.weight"); it
// multiplies in FP8 when its shape is also fp8_eligible.
bool fp8_projection_weight(const std::string& name);

// The recipe above in fp64 from the same quantised operands: y, and dx, dW, db for a given dy.
struct Fp8Reference {
  at::Tensor y, dx, dw, db;
};
Fp8Reference fp8_linear_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                  const at::Tensor& dy, bool rowwise);

// Installs fp8_linear in every block's projections when `precision` is fp8 or fp8_rowwise
// (nothing otherwise), reusing `casts` when given; returns how many projections multiply in FP8
// (for the log).
int64_t apply_fp8(DiTImpl& model, Precision precision, bool fast_accum = false,
                  std::shared_ptr<Fp8Casts> casts = nullptr);

}  // namespace vidit
