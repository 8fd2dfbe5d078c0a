#include "diffusion/unipc.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace vidit {

namespace {

// The float64 grid before rounding: shift(linspace(1, 1/T, steps + 1)[:steps]), first value
// nudged below 1. linspace as numpy computes it: i * ((stop - start) / steps) + start, separate
// roundings (two tensor ops, so no fused multiply-add can sneak in).
at::Tensor flow_sigmas_f64(int64_t steps, double shift, int64_t T) {
  VIDIT_CHECK(steps >= 1, "UniPC sampling needs at least one step (sample.steps = ", steps, ")");
  VIDIT_CHECK(shift > 0, "the sigma shift must be > 0 (got ", shift, ")");
  VIDIT_CHECK(T >= 1, "num_train_timesteps must be >= 1 (got ", T, ")");
  at::Tensor s = at::arange(steps, at::kDouble).mul_((1.0 / double(T) - 1.0) / double(steps)).add_(1.0);
  s = s * shift / ((s * (shift - 1)) + 1);
  // At sigma = 1, lambda = log(1 - sigma) - log(sigma) would be -inf.
  if (std::fabs(s[0].item<double>() - 1.0) < 1e-6) s[0] = s[0].item<double>() - 1e-6;
  return s;
}

// sum_k w[k] * d[k] over the earlier steps' differences, with the contraction diffusers uses
// (an einsum over a [B, K, C, ...] stack), so orders above 2 round as it does. Samples of rank
// 1 ([B]) get a unit C dimension for it.
at::Tensor weighted_sum(const at::Tensor& w, const std::vector<at::Tensor>& d) {
  const bool flat = d[0].dim() < 2;
  std::vector<at::Tensor> dd;
  for (const at::Tensor& t : d) dd.push_back(flat ? t.reshape({t.size(0), 1}) : t);
  at::Tensor r = at::einsum("k,bkc...->bc...", {w, at::stack(dd, 1)});
  return flat ? r.reshape(d[0].sizes()) : r;
}

}  // namespace

at::Tensor unipc_sigmas(int64_t steps, double shift) {
  return at::cat({flow_sigmas_f64(steps, shift, 1000), at::zeros({1}, at::kDouble)}).to(at::kFloat);
}

at::Tensor unipc_timesteps(int64_t steps, double shift) {
  return (flow_sigmas_f64(steps, shift, 1000) * 1000).to(at::kLong);
}

UniPCSolver::UniPCSolver() : UniPCSolver(Options{}) {}

UniPCSolver::UniPCSolver(Options opt) : opt_(opt) {
  VIDIT_CHECK(opt_.order >= 1 && opt_.order <= 3, "UniPC order must be 1, 2 or 3 (got ", opt_.order, ")");
}

void UniPCSolver::set_timesteps(int64_t steps, double shift) {
  at::Tensor s = flow_sigmas_f64(steps, shift, opt_.num_train_timesteps);
  timesteps_ = (s * double(opt_.num_train_timesteps)).to(at::kLong);
  sigmas_ = at::cat({s, at::zeros({1}, at::kDouble)}).to(at::kFloat);
  sigmas_dev_ = at::Tensor();
  x0_history_.clear();
  last_sample_ = at::Tensor();
  next_index_ = warm_ = last_order_ = 0;
}

at::Tensor UniPCSolver::lambda_at(int64_t i) const {
  // Flow sigmas: alpha = 1 - sigma; lambda = log(alpha) - log(sigma) (+inf at sigma = 0).
  at::Tensor sigma = sigma_at(i);
  return at::log(1 - sigma) - at::log(sigma);
}

// The scalars of one UniP or UniC update from sigma_s0 to sigma_t (0-dim fp32 on the device):
// h = lambda_t - lambda_s0 and, with hh = -h (data prediction), the phi-function weights
// b_k (k = 1..order) and B(h) = e^hh - 1 ("bh2"); rks are the earlier steps' lambda offsets
// relative to h (the last one 1), R the Vandermonde matrix of rks the weights solve against.
struct UniPCSolver::Coefficients {
  at::Tensor sigma_ratio;  // sigma_t / sigma_s0
  at::Tensor alpha_t;      // 1 - sigma_t
  at::Tensor h_phi_1;      // e^hh - 1
  at::Tensor B_h;
  at::Tensor rks;          // [order]
  at::Tensor R;            // [order, order]
  at::Tensor b;            // [order]
};

// Earlier predictions are at s0 - 1, s0 - 2, ... (the history holds them newest last).
UniPCSolver::Coefficients UniPCSolver::coefficients(int64_t t, int64_t s0, int64_t order) const {
  Coefficients c;
  at::Tensor sigma_t = sigma_at(t), sigma_s0 = sigma_at(s0);
  c.alpha_t = 1 - sigma_t;
  c.sigma_ratio = sigma_t / sigma_s0;
  const at::Tensor lambda_t = lambda_at(t), lambda_s0 = lambda_at(s0);
  const at::Tensor h = lambda_t - lambda_s0;

  std::vector<at::Tensor> rks;
  for (int64_t k = 1; k < order; ++k) rks.push_back((lambda_at(s0 - k) - lambda_s0) / h);
  rks.push_back(at::ones({}, sigma_t.options()));
  c.rks = at::stack(rks);

  const at::Tensor hh = -h;
  c.h_phi_1 = at::expm1(hh);
  c.B_h = at::expm1(hh);
  at::Tensor h_phi_k = c.h_phi_1 / hh - 1;
  int64_t factorial = 1;
  std::vector<at::Tensor> R, b;
  for (int64_t k = 1; k <= order; ++k) {
    R.push_back(at::pow(c.rks, k - 1));
    b.push_back(h_phi_k * factorial / c.B_h);
    factorial *= k + 1;
    h_phi_k = h_phi_k / hh - 1.0 / double(factorial);
  }
  c.R = at::stack(R);
  c.b = at::stack(b);
  return c;
}

at::Tensor UniPCSolver::step(const at::Tensor& model_output, int64_t index, const at::Tensor& sample) {
  VIDIT_CHECK(steps() > 0, "UniPCSolver::step before set_timesteps");
  VIDIT_CHECK(index >= 0 && index < steps(), "UniPC step index ", index, " is outside 0..", steps() - 1);
  VIDIT_CHECK(index == 0 || index == next_index_, "UniPC steps must be taken in order: got step ", index,
              " after step ", next_index_ - 1, " (step 0 starts a new trajectory)");
  VIDIT_CHECK(model_output.sizes() == sample.sizes(), "UniPC model output ", model_output.sizes(),
              " does not match the sample ", sample.sizes());
  VIDIT_CHECK(sample.dim() >= 1, "UniPC samples need a batch dimension");
  at::NoGradGuard ng;
  if (index == 0) {
    x0_history_.clear();
    last_sample_ = at::Tensor();
    warm_ = last_order_ = 0;
  }
  if (!sigmas_dev_.defined() || sigmas_dev_.device() != sample.device()) sigmas_dev_ = sigmas_.to(sample.device());

  const at::ScalarType dtype = sample.scalar_type();
  at::Tensor x = sample.to(at::kFloat);
  const at::Tensor v = model_output.to(at::kFloat);
  // Flow prediction to data prediction: x0 = x - sigma * v.
  const at::Tensor x0 = x - sigma_at(index) * v;

  // UniC: the prediction just made at this step refines the previous step, which went from
  // last_sample_ at sigma[index-1] to x here.
  if (index > 0 && last_sample_.defined()) {
    const int64_t p = last_order_;
    Coefficients c = coefficients(index, index - 1, p);
    const at::Tensor& m0 = x0_history_.back();
    std::vector<at::Tensor> D1s;
    for (int64_t k = 1; k < p; ++k) D1s.push_back((x0_history_[x0_history_.size() - 1 - k] - m0) / c.rks[k - 1]);
    const at::Tensor rhos_c = p == 1 ? at::ones({1}, x.options()) * 0.5 : at::linalg_solve(c.R, c.b).to(at::kFloat);
    const at::Tensor x_t_ = c.sigma_ratio * last_sample_ - c.alpha_t * c.h_phi_1 * m0;
    at::Tensor res = rhos_c[p - 1] * (x0 - m0);
    if (!D1s.empty()) res = weighted_sum(rhos_c.narrow(0, 0, p - 1), D1s) + res;
    x = x_t_ - c.alpha_t * c.B_h * res;
  }

  x0_history_.push_back(x0);
  while (int64_t(x0_history_.size()) > opt_.order) x0_history_.pop_front();

  int64_t order = opt_.order;
  if (opt_.lower_order_final) order = std::min(order, steps() - index);
  order = std::min(order, warm_ + 1);  // warm-up: no more past predictions than exist

  // UniP: from x at sigma[index] to sigma[index + 1].
  last_sample_ = x;
  Coefficients c = coefficients(index + 1, index, order);
  const at::Tensor& m0 = x0_history_.back();
  std::vector<at::Tensor> D1s;
  for (int64_t k = 1; k < order; ++k) D1s.push_back((x0_history_[x0_history_.size() - 1 - k] - m0) / c.rks[k - 1]);
  at::Tensor x_next = c.sigma_ratio * x - c.alpha_t * c.h_phi_1 * m0;
  if (!D1s.empty()) {
    // Order 2 uses rho = 1/2 (diffusers' simplification); higher orders solve for the weights.
    const at::Tensor rhos_p =
        order == 2 ? at::ones({1}, x.options()) * 0.5
                   : at::linalg_solve(c.R.narrow(0, 0, order - 1).narrow(1, 0, order - 1), c.b.narrow(0, 0, order - 1))
                         .to(at::kFloat);
    const at::Tensor res = weighted_sum(rhos_p, D1s);
    x_next = x_next - c.alpha_t * c.B_h * res;
  }

  last_order_ = order;
  warm_ = std::min(warm_ + 1, opt_.order);
  next_index_ = index + 1;
  return x_next.to(dtype);
}

at::Tensor unipc_sample(const VelocityField& field, const at::Tensor& x1, const at::Tensor& text,
                        const at::Tensor& negative_text, const UniPCOptions& opt) {
  at::NoGradGuard ng;
  UniPCSolver::Options so;
  so.order = opt.order;
  UniPCSolver solver(so);
  solver.set_timesteps(opt.steps, opt.shift);
  const int64_t B = x1.size(0);
  const at::Tensor ts = solver.timesteps().contiguous();
  at::Tensor x = x1.to(at::kFloat);
  for (int64_t i = 0; i < solver.steps(); ++i) {
    at::Tensor t = at::full({B}, double(ts.data_ptr<int64_t>()[i]), x.options());
    at::Tensor v = guided_velocity(field, x, t, text, negative_text, opt.cfg_scale);
    x = solver.step(v, i, x);
  }
  return x.to(x1.scalar_type());
}

}  // namespace vidit
