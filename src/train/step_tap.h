// A read-only view into the training step, for checks against an independent implementation
// (bench_train_step --dump, the gradient golden test). The step calls it at two points and
// nothing it does changes the step:
//   micro_batch  after the forward and the loss of each micro-batch, with this rank's rows of
//                the model's inputs (x_t, timestep = sigma x 1000, the text as fed after caption
//                dropout), the flow-matching target and the micro-batch's loss (unweighted mean
//                over this rank's rows);
//   before_clip  after the last micro-batch's gradient reductions, before clipping: every
//                parameter's .grad is this rank's part of the global batch's gradient, and
//                `loss` is the step's global mean loss. The parallel model can gather them whole
//                (ParallelModel::whole, collective: every rank's tap must make the same calls).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace vidit {

class ParallelModel;

class StepTap {
 public:
  virtual ~StepTap() = default;
  virtual void micro_batch(int64_t step, int64_t micro, const at::Tensor& x_t, const at::Tensor& timestep,
                           const at::Tensor& text, const at::Tensor& target, const at::Tensor& loss) {}
  virtual void before_clip(int64_t step, double loss, const ParallelModel& model) {}
};

}  // namespace vidit
