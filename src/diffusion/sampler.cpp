#include "diffusion/sampler.h"

#include "core/error.h"
#include "diffusion/flow_matching.h"
#include "diffusion/unipc.h"

namespace vidit {

at::Tensor euler_sigmas(int64_t steps, double shift) {
  return shift_sigma(at::linspace(1.0, 0.0, steps + 1, at::kDouble), shift);
}

namespace {

// numpy.linspace(start, stop, num) in float64, element for element: i * ((stop - start) / (num - 1))
// + start, the last element set to `stop` (diffusers builds its grids with it, and the model
// timesteps it derives are sensitive to the last bit).
at::Tensor numpy_linspace(double start, double stop, int64_t num) {
  at::Tensor y = at::arange(num, at::kDouble);
  if (num > 1) {
    y.mul_((stop - start) / double(num - 1)).add_(start);
    y[num - 1] = stop;
  } else {
    y.fill_(start);
  }
  return y;
}

}  // namespace

at::Tensor flow_euler_sigmas_diffusers(int64_t steps, double shift) {
  VIDIT_CHECK(steps >= 1, "Euler sampling needs at least one step (sample.steps = ", steps, ")");
  VIDIT_CHECK(shift > 0, "the sigma shift must be > 0 (got ", shift, ")");
  const int64_t T = 1000;
  // The scheduler's construction: training sigmas t/1000, t = 1000..1, shifted once in fp32.
  // Only the ends are kept (sigma_max, sigma_min), as Python floats.
  at::Tensor train = at::arange(1, T + 1, at::kFloat).flip(0) / T;
  train = train * shift / ((train * (shift - 1)) + 1);
  const double sigma_max = train[0].item<float>(), sigma_min = train[T - 1].item<float>();
  // set_timesteps: linspace over timesteps in float64, back to sigmas, shifted again, to fp32.
  at::Tensor sig = numpy_linspace(sigma_max * double(T), sigma_min * double(T), steps) / double(T);
  sig = (sig * shift / ((sig * (shift - 1)) + 1)).to(at::kFloat);
  return at::cat({sig, at::zeros({1}, at::kFloat)});
}

at::Tensor flow_euler_timesteps_diffusers(int64_t steps, double shift) {
  return flow_euler_sigmas_diffusers(steps, shift).narrow(0, 0, steps) * 1000;
}

at::Tensor expand_text(const at::Tensor& negative_text, const at::Tensor& text) {
  VIDIT_CHECK(text.dim() == 3, "text embeddings must be [B, Lt, D], got ", text.sizes());
  at::Tensor neg = negative_text.dim() == 2 ? negative_text.unsqueeze(0) : negative_text;
  VIDIT_CHECK(neg.dim() == 3 && (neg.size(0) == 1 || neg.size(0) == text.size(0)) &&
                  neg.size(1) == text.size(1) && neg.size(2) == text.size(2),
              "the negative (null) text embedding ", negative_text.sizes(), " does not match the text ",
              text.sizes(), ": give [Lt, D], [1, Lt, D] or [B, Lt, D] with the same Lt and D (pad both "
              "to the model's text length)");
  return neg.expand_as(text).to(text.options());
}

at::Tensor guided_velocity(const VelocityField& field, const at::Tensor& x, const at::Tensor& t,
                           const at::Tensor& text, const at::Tensor& negative_text, double cfg_scale) {
  if (cfg_scale == 1.0) return field(x, t, text).to(at::kFloat);
  // One batched call for the conditional and unconditional halves.
  at::Tensor out = field(at::cat({x, x}), at::cat({t, t}), at::cat({text, expand_text(negative_text, text)}));
  VIDIT_CHECK(out.size(0) == 2 * x.size(0), "the velocity field returned batch ", out.size(0), " for an input of ",
              2 * x.size(0));
  auto halves = out.to(at::kFloat).chunk(2, 0);
  return halves[1] + cfg_scale * (halves[0] - halves[1]);
}

at::Tensor euler_sample(const VelocityField& field, at::Tensor x, const at::Tensor& text,
                        const at::Tensor& null_text, const EulerOptions& opt) {
  at::NoGradGuard ng;
  const int64_t B = x.size(0);
  if (opt.grid == EulerGrid::linear) {
    at::Tensor sig = euler_sigmas(opt.steps, opt.shift);
    for (int64_t i = 0; i < opt.steps; ++i) {
      const double s = sig[i].item<double>(), s_next = sig[i + 1].item<double>();
      at::Tensor t = at::full({B}, s * 1000.0, x.options().dtype(at::kFloat));
      at::Tensor v = guided_velocity(field, x, t, text, null_text, opt.cfg_scale);
      x = x + (s_next - s) * v.to(x.scalar_type());
    }
    return x;
  }
  // diffusers' FlowMatchEulerDiscreteScheduler.step: fp32 sample, dt = sigma_next - sigma in fp32.
  const at::ScalarType dtype = x.scalar_type();
  at::Tensor sig = flow_euler_sigmas_diffusers(opt.steps, opt.shift).contiguous();
  const float* s = sig.data_ptr<float>();
  x = x.to(at::kFloat);
  for (int64_t i = 0; i < opt.steps; ++i) {
    at::Tensor t = at::full({B}, s[i] * 1000.0f, x.options());
    at::Tensor v = guided_velocity(field, x, t, text, null_text, opt.cfg_scale);
    const float dt = s[i + 1] - s[i];
    x = x + dt * v;
  }
  return x.to(dtype);
}

at::Tensor sample_latents(const VelocityField& field, const at::Tensor& x1, const at::Tensor& text,
                          const at::Tensor& negative_text, const SampleConfig& cfg) {
  if (cfg.solver == Solver::unipc) {
    UniPCOptions opt;
    opt.steps = cfg.steps;
    opt.shift = cfg.shift;
    opt.cfg_scale = cfg.cfg_scale;
    return unipc_sample(field, x1, text, negative_text, opt);
  }
  EulerOptions opt{cfg.steps, cfg.shift, cfg.cfg_scale, EulerGrid::diffusers};
  return euler_sample(field, x1, text, negative_text, opt);
}

}  // namespace vidit
