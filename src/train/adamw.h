// AdamW with decoupled weight decay, applied to named fp32 parameters through ATen's fused
// multi-tensor kernel (one call per weight-decay group instead of six ops per parameter). Norm weights, biases,
// modulation tensors and other 1-D parameters get no weight decay. Its state (step count,
// exp_avg, exp_avg_sq per parameter name) round-trips through a TensorMap for checkpoints.
#pragma once
#include <ATen/ATen.h>

#include "core/safetensors.h"

namespace vidit {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.01;
};

class AdamW {
 public:
  // `params`: name -> live parameter (requires grad). Order of updates is the map's order.
  // `decay_reference`, when given, holds the whole parameter for each name whose weight-decay
  // decision no_decay() should make (the params being shards of them, parallel/fsdp.h).
  AdamW(const TensorMap& params, AdamWOptions opt, const TensorMap& decay_reference = {});
  // One update at learning rate `lr` using each parameter's .grad() (skipped when undefined).
  void step(double lr);
  int64_t steps_taken() const { return step_; }
  // True when `name` is exempt from weight decay.
  static bool no_decay(const std::string& name, const at::Tensor& p);

  TensorMap state() const;  // "exp_avg/<name>", "exp_avg_sq/<name>", "step"
  // Throws vidit::Error naming a key of state() that `state` lacks or holds in another shape;
  // changes nothing.
  void check_state(const TensorMap& state, const std::string& source) const;
  // Restores state(), checked first: on an error nothing has changed.
  void load_state(const TensorMap& state, const std::string& source);

 private:
  struct Slot {
    std::string name;
    at::Tensor param, exp_avg, exp_avg_sq;
    at::Tensor step;  // fp32 scalar, the fused kernel's per-parameter step count
    bool decay;
  };
  std::vector<Slot> slots_;
  AdamWOptions opt_;
  int64_t step_ = 0;
};

// Scales all gradients so their global L2 norm is at most max_norm (0: no clipping).
// Returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace vidit
