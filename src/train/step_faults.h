// The training step's faults (resilience/fault_injection.h), injected by wrapping what the step
// calls, as resilience/faulty_storage.h wraps Storage, so that the step itself holds no fault code:
//  - FaultyBatchSource forwards every call to the run's batch source; in step faults.step the
//    first sample of this rank's micro-batch comes with its latents x 1000 (poison_sample);
//  - install_step_faults chains a model_end hook (model/dit.h) onto the DiT: after the forward
//    of every step from faults.step on, the rank sleeps faults.seconds (slow); in step
//    faults.step the first prediction is x 100, once (glitch), or the prediction's gradient is
//    NaN, so every gradient this rank computes is (nan_grad).
// Which rank, which attempt and "once" are the FaultInjector's to decide; both wrappers read the
// trainer's count of finished steps (the step being computed is one more). Installed only when
// the config names one of these faults.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "core/config.h"
#include "loader/batch_source.h"
#include "model/dit.h"
#include "resilience/fault_injection.h"

namespace vidit {

class FaultyBatchSource : public BatchSource {
 public:
  FaultyBatchSource(std::shared_ptr<BatchSource> base, FaultInjector& faults, const int64_t& steps_done)
      : base_(std::move(base)), faults_(faults), steps_done_(steps_done) {}

  MicroBatch next(int64_t batch_size) override;
  SamplerState state() const override { return base_->state(); }
  void set_state(const SamplerState& s) override { base_->set_state(s); }
  bool slices_global_batch() const override { return base_->slices_global_batch(); }
  void skip(std::set<std::string> keys) override { base_->skip(std::move(keys)); }

 private:
  std::shared_ptr<BatchSource> base_;
  FaultInjector& faults_;
  const int64_t& steps_done_;
};

// `source` wrapped in a FaultyBatchSource when the config asks for poison_sample, else itself.
std::shared_ptr<BatchSource> with_step_faults(std::shared_ptr<BatchSource> source, const FaultConfig& cfg,
                                              FaultInjector& faults, const int64_t& steps_done);

// The model_end hook for slow, glitch and nan_grad, after whatever hook the model had; nothing
// when the config asks for none of them. `faults` and `steps_done` must outlive the model's use.
void install_step_faults(DiTImpl& model, const FaultConfig& cfg, FaultInjector& faults, const int64_t& steps_done);

}  // namespace vidit
