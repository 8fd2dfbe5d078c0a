// A model of the step time, and so of MFU, from the config alone and the device's rates: what
// `vidit plan --rates ...` or `vidit plan --measure` prints beside the memory and the bytes.
//
// Per rank and optimizer step (A micro-batches of b samples per data-parallel rank; the work of
// a sample split over sequence parallel x tensor parallel ranks):
//  - matmul FLOPs: the linear layers (model_info.h's accounting less attention), x 3 for
//    forward + backward, plus one more forward of every recomputed block;
//  - attention FLOPs: 4 L^2 d per block forward (QK^T and AV) and 4 L Lt d for cross-attention,
//    x 3 (the backward of a fused attention costs about twice its forward), plus recomputation;
//  - elementwise bytes: what the norms, modulation, RoPE, activations and residuals read and
//    write, taken as 3 x the activations a block keeps for backward (StepPlan's estimate):
//    written forward, read and their gradients written backward; and the update (AdamW, EMA,
//    clipping: about 13 fp32 passes over the parameters the rank keeps);
//  - communication bytes: StepPlan's bytes sent per rank.
// Each is divided by its rate: matmul and attention FLOP/s, memory bytes/s, link bytes/s (bus
// bandwidth). The step takes between the compute time plus the communication time (nothing
// overlapped: `serial`) and the larger of the two (everything overlapped). MFU is the model's
// FLOPs (without recomputation, the convention) over step time x peak.
//
// The rates come from --rates (a GPU's datasheet, or vidit health's figures) or from
// measure_rates(): this process's own matmul at the model's width, attention at the model's
// shape, and a large copy, timed on the training device in the training dtype (fp32 on the CPU,
// bf16 on a GPU). bench/bench_step_time.cpp checks predictions against measured steps.
#pragma once
#include <string>

#include "core/config.h"
#include "parallel/plan.h"

namespace vidit {

struct DeviceRates {
  double matmul_flops = 0;     // FLOP/s of the linear layers' matmuls
  double attention_flops = 0;  // FLOP/s of attention at the model's shape (0: the matmul rate)
  double memory_bytes = 0;     // bytes/s of elementwise work (0: not modelled)
  double link_bytes = 0;       // bus bytes/s a rank sends (0: communication not modelled)
  double peak_flops = 0;       // the device's peak in the training dtype (0: no MFU)
  std::string source;          // where they came from, for the printout
};

struct StepTimePrediction {
  double model_flops = 0;                 // per rank and step, without recomputation
  double matmul_flops = 0, attention_flops = 0, elementwise_bytes = 0, comm_bytes = 0;
  double matmul_s = 0, attention_s = 0, elementwise_s = 0, comm_s = 0;
  double compute_s() const { return matmul_s + attention_s + elementwise_s; }
  double serial_s() const { return compute_s() + comm_s; }
  double overlapped_s() const { return compute_s() > comm_s ? compute_s() : comm_s; }
  double mfu(double step_s, double peak) const { return step_s > 0 && peak > 0 ? model_flops / step_s / peak : 0; }
};

StepTimePrediction predict_step_time(const Config& cfg, const StepPlan& plan, const DeviceRates& rates);
std::string format_step_time(const StepTimePrediction& p, const DeviceRates& rates);

// Times this process's matmul (the model's width: [b L, d] x [d, ffn]), scaled dot-product
// attention at the model's shape and a large copy on `device`, best of a few runs each.
DeviceRates measure_rates(const Config& cfg, const std::string& device);

}  // namespace vidit
