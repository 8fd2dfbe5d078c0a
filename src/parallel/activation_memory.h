// What one block holds between its forward and its backward, measured on the device the run
// uses, for each activation-checkpointing policy.
//
// The plan's activation figure is otherwise a formula, and the tensors a block saves depend on
// the device and the precision: on a GPU the norms, RoPE and residual sums are fused kernels
// that save less than ATen's chain, autocast keeps bf16 copies, FP8 layers keep e4m3 inputs. So
// the figure that chooses activation checkpointing for train.memory_budget_gb is taken by
// running the model's own code: a model of the config's shapes with one block and with two, at
// three token counts and two batch sizes, under the run's autocast and FP8 layers. The difference
// of the two models is one block; the three token counts and the second batch size give the
// terms of Line below. The bytes are the allocator's:
// glibc's statistics for CPU tensors, the caching allocator on a GPU (core/device_memory.h).
//
// One block of the whole width is measured: under tensor parallel a rank holds a part of some
// of these tensors, which the plan does not model (it uses the figure whole, an upper bound).
#pragma once
#include <string>

#include <c10/core/Device.h>

#include "core/config.h"

namespace vidit {

struct BlockActivations {
  // Bytes a block holds in a forward of b samples of L tokens:
  //   per_forward + b (per_sample + per_token L + per_pair L^2)
  // per_forward: what does not grow with the batch (autocast's bf16 copies of the block's
  // weights, which its backward keeps); per_sample: the cross-attention's keys and values of the
  // text; per_pair: the attention's L x L weights where a kernel keeps them (ATen's math path, as
  // on the CPU; the flash and cuDNN kernels keep O(L)).
  struct Line {
    double per_token = 0, per_sample = 0, per_pair = 0, per_forward = 0;
    double bytes(double samples, double tokens) const {
      return per_forward + samples * (per_sample + per_token * tokens + per_pair * tokens * tokens);
    }
  };
  Line keep, selective, whole;  // no recomputation; recomputed selectively; recomputed whole
  std::string source;           // "measured on cuda:0 (bf16)", for the printout
};

BlockActivations measure_block_activations(const Config& cfg, const at::Device& device);

}  // namespace vidit
