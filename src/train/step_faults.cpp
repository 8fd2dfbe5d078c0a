#include "train/step_faults.h"

#include <limits>

namespace vidit {

MicroBatch FaultyBatchSource::next(int64_t batch_size) {
  MicroBatch mb = base_->next(batch_size);
  if (mb.latents.defined() && mb.latents.size(0) > 0 && faults_.poison_sample(steps_done_ + 1)) {
    mb.latents = mb.latents.clone();  // the source may keep (or reuse) the tensor it handed out
    mb.latents[0].mul_(1000);
  }
  return mb;
}

std::shared_ptr<BatchSource> with_step_faults(std::shared_ptr<BatchSource> source, const FaultConfig& cfg,
                                              FaultInjector& faults, const int64_t& steps_done) {
  if (cfg.kind != FaultKind::poison_sample) return source;
  return std::make_shared<FaultyBatchSource>(std::move(source), faults, steps_done);
}

void install_step_faults(DiTImpl& model, const FaultConfig& cfg, FaultInjector& faults, const int64_t& steps_done) {
  if (cfg.kind != FaultKind::slow && cfg.kind != FaultKind::glitch && cfg.kind != FaultKind::nan_grad) return;
  auto inner = model.hooks.model_end;
  model.hooks.model_end = [inner, &faults, &steps_done](const at::Tensor& prediction) {
    at::Tensor out = inner ? inner(prediction) : prediction;
    const int64_t step = steps_done + 1;
    faults.slow_compute(step);
    if (out.size(0) > 0 && faults.glitch(step)) {
      const at::Tensor first = at::arange(out.size(0), out.options().dtype(at::kLong)) == 0;
      out = out * at::where(first, 100.0, 1.0).to(out.scalar_type()).view({-1, 1, 1, 1, 1});
    }
    if (out.requires_grad() && faults.nan_gradient(step)) {
      out = out.view_as(out);  // a node of its own, so the hook below is this pass's alone
      out.register_hook([](const at::Tensor& grad) { return grad * std::numeric_limits<double>::quiet_NaN(); });
    }
    return out;
  };
}

}  // namespace vidit
