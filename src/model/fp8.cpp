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
at::Tensor scaled_mm_nt(const Fp8Tensor& a, const Fp8Tensor& b, bool fast_accum = false) {
  auto contiguous = [](const at::Tensor& t) { return t.is_contiguous() ? t : t.view(at::kByte).contiguous().view(t.scalar_type()); };
  return at::_scaled_mm(contiguous(a.data), contiguous(b.data).t(), a.scale, column_scale(b), std::nullopt,
                        std::nullopt, at::kBFloat16, fast_accum);
}

// dx = dy W for W in e4m3 (w8) and dy [rows, out]: tensorwise, dy in e5m2 times W8 with W's
// scale; rowwise, W's row scales moved onto dy's columns first (fp8.h).
// dy8: dy in e5m2 already (the tensorwise operand).
at::Tensor input_grad(const at::Tensor& dy, const Fp8Tensor& dy8, const Fp8Tensor& w8, bool rowwise) {
  const Fp8Tensor wt8{w8.data.t(), rowwise ? at::ones({}, w8.scale.options()) : w8.scale};
  if (!rowwise) return scaled_mm_nt(dy8, wt8);
  return scaled_mm_nt(to_fp8(dy.to(at::kFloat) * w8.scale.view({1, -1}), at::kFloat8_e5m2, false), wt8);
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
  // w8_data / w8_scale: W in e4m3 already (fp8_linear's w8), or undefined.
  // (Optional tensors: autograd takes an undefined one only as an empty optional.)
  // x8_data / x8_scale: x's rows in e4m3 already (fp8_linear's casts), or undefined.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& bias, bool rowwise, bool fast_accum,
                            const std::optional<at::Tensor>& w8_data_in, const std::optional<at::Tensor>& w8_scale_in,
                            const std::optional<at::Tensor>& x8_data, const std::optional<at::Tensor>& x8_scale) {
    const at::Tensor b = bias.value_or(at::Tensor()), w8_data = w8_data_in.value_or(at::Tensor()),
                     w8_scale = w8_scale_in.value_or(at::Tensor());
    const Fp8Tensor x8 = x8_data ? Fp8Tensor{*x8_data, *x8_scale}
                                 : to_fp8(x.reshape({-1, x.size(-1)}), at::kFloat8_e4m3fn, rowwise);
    const Fp8Tensor w8 = w8_data.defined() ? Fp8Tensor{w8_data, w8_scale} : to_fp8(w, at::kFloat8_e4m3fn, rowwise);
    at::Tensor y = scaled_mm_nt(x8, w8, fast_accum);
    if (b.defined()) y = y + b.to(y.scalar_type());
    // Backward casts W again from W (the same bytes), or reads the given copy (which FSDP
    // refills before the block's backward, as it refills W; Fp8Casts keeps it for the step).
    ctx->save_for_backward({x8.data, x8.scale, w, w8_data, w8_scale});
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
    const Fp8Tensor w8 = saved[3].defined() ? Fp8Tensor{saved[3], saved[4]} : to_fp8(w, at::kFloat8_e4m3fn, rowwise);
    std::vector<int64_t> shape = grad[0].sizes().vec();
    shape.back() = w.size(1);
    const at::Tensor dx =
        input_grad(dy, dy8, w8, rowwise).to(at::ScalarType(ctx->saved_data["x_dtype"].toInt())).view(shape);
    // dW = dy^T x, summed over the tokens.
    Fp8Tensor x8{saved[0], saved[1]};
    if (rowwise) x8 = to_fp8(from_fp8(x8), at::kFloat8_e4m3fn, false);
    const Fp8Tensor dyt8{padded_transpose(dy8.data), dy8.scale}, xt8{padded_transpose(x8.data), x8.scale};
    const at::Tensor dw = scaled_mm_nt(dyt8, xt8).to(w.scalar_type());
    at::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) db = dy.sum(0, false, at::kFloat).to(w.scalar_type());
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8_scale(const at::Tensor& amax, at::ScalarType dtype) {
  return amax.clamp_min(1e-12) / fp8_max(dtype);  // the value the FP8 grid's top stands for
}

at::Tensor fp8_cast(const at::Tensor& t, const at::Tensor& scale, at::ScalarType dtype) {
  const double max = fp8_max(dtype);
  return (t / scale).clamp(-max, max).to(dtype);
}

Fp8Tensor to_fp8(const at::Tensor& t, at::ScalarType dtype, bool rowwise) {
  const at::Tensor f = t.to(at::kFloat);
  const at::Tensor scale = fp8_scale(rowwise ? f.abs().amax({-1}, true) : f.abs().amax(), dtype);
  return {fp8_cast(f, scale, dtype), rowwise ? scale.contiguous() : scale.reshape({})};
}

at::Tensor from_fp8(const Fp8Tensor& t) { return t.data.to(at::kFloat) * t.scale; }

bool fp8_eligible(int64_t in, int64_t out) { return in % 16 == 0 && out % 16 == 0 && in > 0 && out > 0; }

bool fp8_projection_weight(const std::string& name) {
  // blocks.<i>.{self_attn,cross_attn}.{q,k,v,o}.weight and the MLP's blocks.<i>.ffn.{0,2}.weight
  if (name.rfind("blocks.", 0) != 0) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return false;
  const std::string rest = name.substr(dot + 1);
  for (const char* m : {"self_attn.", "cross_attn."})
    for (const char* p : {"q", "k", "v", "o"})
      if (rest == std::string(m) + p + ".weight") return true;
  return rest == "ffn.0.weight" || rest == "ffn.2.weight" || rest == "cross_attn.k_img.weight" ||
         rest == "cross_attn.v_img.weight";
}

Fp8Tensor Fp8Casts::weight(const at::Tensor& w, bool rowwise) {
  at::NoGradGuard ng;
  auto it = weights_kept_.find(w.unsafeGetTensorImpl());
  if (it != weights_kept_.end() && it->second.rowwise == rowwise) return ++weight_reuses, it->second.cast;
  ++weight_casts;
  Kept& k = weights_kept_[w.unsafeGetTensorImpl()];
  k = Kept{w, rowwise, to_fp8(w, at::kFloat8_e4m3fn, rowwise)};
  return k.cast;
}

Fp8Tensor Fp8Casts::input(const at::Tensor& x, const at::Tensor& x2, bool rowwise) {
  at::NoGradGuard ng;
  if (last_input_ && last_input_->lock().get() == x.unsafeGetTensorImpl() && x._version() == last_version_ &&
      x.data_ptr() == last_data_ && rowwise == last_rowwise_)
    return ++input_reuses, last_cast_;
  ++input_casts;
  last_cast_ = to_fp8(x2, at::kFloat8_e4m3fn, rowwise);
  last_input_.emplace(x.getIntrusivePtr());
  last_version_ = x._version(), last_data_ = x.data_ptr(), last_rowwise_ = rowwise;
  return last_cast_;
}

void Fp8Casts::clear() {
  weights_kept_.clear();
  last_input_.reset();
  last_cast_ = Fp8Tensor{};
  last_data_ = nullptr;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool rowwise, bool fast_accum,
                      const Fp8Tensor* w8, Fp8Casts* casts) {
  if (!fp8_eligible(w.size(1), w.size(0))) return at::linear(x, w, b);
  auto maybe = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  std::optional<at::Tensor> w8_data, w8_scale, x8_data, x8_scale;
  if (w8) w8_data = maybe(w8->data), w8_scale = maybe(w8->scale);
  if (casts) {
    // (Unkept, W is cast in the forward and again in backward: a cast saved for backward would
    // hold every weight FSDP frees between uses.)
    if (!w8 && casts->keeps_weights()) {
      const Fp8Tensor c = casts->weight(w, rowwise);
      w8_data = c.data, w8_scale = c.scale;
    }
    const Fp8Tensor c = casts->input(x, x.reshape({-1, x.size(-1)}), rowwise);
    x8_data = c.data, x8_scale = c.scale;
  }
  return Fp8Linear::apply(x, w, maybe(b), rowwise, fast_accum, w8_data, w8_scale, x8_data, x8_scale);
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
  const Fp8Tensor w8 = to_fp8(w, at::kFloat8_e4m3fn, rowwise);
  r.dx = rowwise ? at::matmul(f64(to_fp8(dy2.to(at::kFloat) * w8.scale.view({1, -1}), at::kFloat8_e5m2, false)),
                              w8.data.to(at::kDouble))
                 : at::matmul(g, f64(w8));
  const at::Tensor xs = rowwise ? f64(to_fp8(from_fp8(x8), at::kFloat8_e4m3fn, false)) : f64(x8);
  r.dw = at::matmul(g.t(), xs);
  if (b.defined()) r.db = dy2.to(at::kDouble).sum(0);
  return r;
}

int64_t apply_fp8(DiTImpl& model, Precision precision, bool fast_accum, std::shared_ptr<Fp8Casts> casts) {
  if (!uses_fp8(precision)) return 0;
  const bool rowwise = precision == Precision::fp8_rowwise;
  const LinearFn fn = [rowwise, fast_accum, casts](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return fp8_linear(x, w, b, rowwise, fast_accum, nullptr, casts.get());
  };
  for (const auto& m : *model.blocks) {
    auto& block = *m->as<DiTBlockImpl>();
    block.self_attn->linear_fn = block.cross_attn->linear_fn = block.linear_fn = fn;
  }
  int64_t n = 0;
  for (const auto& item : model.named_parameters(true))
    n += fp8_projection_weight(item.key()) && fp8_eligible(item.value().size(1), item.value().size(0));
  return n;
}

}  // namespace vidit
