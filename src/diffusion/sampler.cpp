#include "diffusion/sampler.h"

#include "diffusion/flow_matching.h"

namespace vidit {

at::Tensor euler_sigmas(int64_t steps, double shift) {
  return shift_sigma(at::linspace(1.0, 0.0, steps + 1, at::kDouble), shift);
}

at::Tensor euler_sample(const VelocityField& field, at::Tensor x, const at::Tensor& text,
                        const at::Tensor& null_text, const EulerOptions& opt) {
  at::NoGradGuard ng;
  const int64_t B = x.size(0);
  at::Tensor sig = euler_sigmas(opt.steps, opt.shift);
  at::Tensor null = null_text.dim() == 2 ? null_text.unsqueeze(0).expand({B, -1, -1}) : null_text;
  const bool guided = opt.cfg_scale != 1.0;
  for (int64_t i = 0; i < opt.steps; ++i) {
    const double s = sig[i].item<double>(), s_next = sig[i + 1].item<double>();
    at::Tensor t = at::full({B}, s * 1000.0, x.options().dtype(at::kFloat));
    at::Tensor v;
    if (guided) {
      // One batched call for the conditional and unconditional halves.
      at::Tensor out = field(at::cat({x, x}), at::cat({t, t}), at::cat({text, null.to(text.options())}));
      auto halves = out.chunk(2, 0);
      v = halves[1] + opt.cfg_scale * (halves[0] - halves[1]);
    } else {
      v = field(x, t, text);
    }
    x = x + (s_next - s) * v.to(x.scalar_type());
  }
  return x;
}

}  // namespace vidit
