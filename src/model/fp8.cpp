#include "model/fp8.h"

#include <torch/autograd.h>

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double fp8_max(at::ScalarType dtype) { return dtype == at::kFloat8_e5m2 ? kE5M2Max : kE4M3Max; }

// A scale of _scaled_mm's right operand: one element, or one per output column ([1, N]).
at::Tensor column_scale(const Fp8Tensor& t) { return t.scale.numel() == 1 ? t.scale : t.scale.t(); }

// a [M, K] (row-major) times b^T, b [N, K]: [M, N] in bf16. _scaled_mm takes its right operand
// column-major, which b^T of a row-major b is.
at::Tensor scaled_mm_nt(const Fp8Tensor& a, const Fp8Tensor& b) {
  auto contiguous = [](const at::Tensor& t) { return t.is_contiguous() ? t : t.view(at::kByte).contiguous().view(t.scalar_type()); };
  return at::_scaled_mm(contiguous(a.data), contiguous(b.data).t(), a.scale, column_scale(b), std::nullopt,
                        std::nullopt, at::kBFloat16);
}

// FP8 data [rows, cols] transposed into a contiguous [cols, rows'], with zero rows appended up
// to a multiple of 16 first (rows are the summed dimension of dW = dy^T x). Moved as bytes: a
// zero byte is 0.0 in both FP8 formats, and byte copies work on every device.
at::Tensor padded_transpose(const at::Tensor& data) {
  const at::Tensor bytes = data.view(at::kByte);
  const int64_t pad = (16 - data.size(0) % 16) % 16;
  const at::Tensor padded = pad == 0 ? bytes : at::cat({bytes, at::zeros({pad, data.size(1)}, bytes.options())});
  return padded.t().contiguous().view(data.scalar_type());
}

class Fp8Linear : public torch::autograd::Function<Fp8Linear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            bool rowwise) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const Fp8Tensor x8 = to_fp8(x2, at::kFloat8_e4m3fn, rowwise), w8 = to_fp8(w, at::kFloat8_e4m3fn, rowwise);
    at::Tensor y = scaled_mm_nt(x8, w8);
    if (b.defined()) y = y + b.to(y.scalar_type());
    ctx->save_for_backward({x8.data, x8.scale, w});
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["has_bias"] = b.defined();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[2];
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const at::Tensor dy = grad[0].reshape({-1, w.size(0)});
    const Fp8Tensor dy8 = to_fp8(dy, at::kFloat8_e5m2, false);
    // dx = dy W: W^T [in, out] as the right operand's rows.
    const Fp8Tensor wt8 = to_fp8(w.t(), at::kFloat8_e4m3fn, false);
    std::vector<int64_t> shape = grad[0].sizes().vec();
    shape.back() = w.size(1);
    const at::Tensor dx = scaled_mm_nt(dy8, wt8).to(at::ScalarType(ctx->saved_data["x_dtype"].toInt())).view(shape);
    // dW = dy^T x, summed over the tokens.
    Fp8Tensor x8{saved[0], saved[1]};
    if (rowwise) x8 = to_fp8(from_fp8(x8), at::kFloat8_e4m3fn, false);
    const Fp8Tensor dyt8{padded_transpose(dy8.data), dy8.scale}, xt8{padded_transpose(x8.data), x8.scale};
    const at::Tensor dw = scaled_mm_nt(dyt8, xt8).to(w.scalar_type());
    at::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) db = dy.sum(0, false, at::kFloat).to(w.scalar_type());
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

Fp8Tensor to_fp8(const at::Tensor& t, at::ScalarType dtype, bool rowwise) {
  const double max = fp8_max(dtype);
  const at::Tensor f = t.to(at::kFloat);
  const at::Tensor amax = (rowwise ? f.abs().amax({-1}, true) : f.abs().amax()).clamp_min(1e-12);
  const at::Tensor scale = amax / max;  // the value one step of the FP8 grid's top stands for
  const at::Tensor data = (f / scale).clamp(-max, max).to(dtype);
  return {data, rowwise ? scale.contiguous() : scale.reshape({})};
}

at::Tensor from_fp8(const Fp8Tensor& t) { return t.data.to(at::kFloat) * t.scale; }

bool fp8_eligible(int64_t in, int64_t out) { return in % 16 == 0 && out % 16 == 0 && in > 0 && out > 0; }

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool rowwise) {
  if (!fp8_eligible(w.size(1), w.size(0))) return at::linear(x, w, b);
  return Fp8Linear::apply(x, w, b, rowwise);
}

Fp8Reference fp8_linear_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                  const at::Tensor& dy, bool rowwise) {
  auto f64 = [](const Fp8Tensor& t) { return from_fp8(t).to(at::kDouble); };
  const at::Tensor x2 = x.reshape({-1, x.size(-1)}), dy2 = dy.reshape({-1, w.size(0)});
  const Fp8Tensor x8 = to_fp8(x2, at::kFloat8_e4m3fn, rowwise);
  Fp8Reference r;
  r.y = at::matmul(f64(x8), f64(to_fp8(w, at::kFloat8_e4m3fn, rowwise)).t());
  if (b.defined()) r.y = r.y + b.to(at::kDouble);
  const at::Tensor g = f64(to_fp8(dy2, at::kFloat8_e5m2, false));
  r.dx = at::matmul(g, f64(to_fp8(w.t(), at::kFloat8_e4m3fn, false)).t());
  const at::Tensor xs = rowwise ? f64(to_fp8(from_fp8(x8), at::kFloat8_e4m3fn, false)) : f64(x8);
  r.dw = at::matmul(g.t(), xs);
  if (b.defined()) r.db = dy2.to(at::kDouble).sum(0);
  return r;
}

int64_t apply_fp8(DiTImpl& model, Precision precision) {
  if (precision != Precision::fp8 && precision != Precision::fp8_rowwise) return 0;
  const bool rowwise = precision == Precision::fp8_rowwise;
  const LinearFn fn = [rowwise](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return fp8_linear(x, w, b, rowwise);
  };
  int64_t n = 0;
  auto count = [&](const torch::nn::Linear& l) { n += fp8_eligible(l->weight.size(1), l->weight.size(0)); };
  for (const auto& m : *model.blocks) {
    auto& block = *m->as<DiTBlockImpl>();
    block.self_attn->linear_fn = block.cross_attn->linear_fn = block.linear_fn = fn;
    for (const auto* l : {&block.self_attn->q, &block.self_attn->k, &block.self_attn->v, &block.self_attn->o,
                          &block.cross_attn->q, &block.cross_attn->k, &block.cross_attn->v, &block.cross_attn->o,
                          &block.fc1, &block.fc2})
      count(*l);
  }
  return n;
}

}  // namespace vidit
