// LoRA: low-rank adapters on the blocks' projections, for fine-tuning a released model with a
// small fraction of its weights in the optimizer ([lora], lora.rank > 0).
//
// Each targeted projection y = x W^T + b (W and b frozen) becomes
//     y = x W^T + b + s * (dropout(x) A^T) B^T,   A [r, in], B [out, r], s = alpha / r,
// with A drawn as nn.Linear draws its weight (Kaiming uniform, a = sqrt(5)) and B zero, so the
// adapted model starts as the base model exactly (PEFT's convention). The targets are the blocks'
// projections by their official names (blocks.N.self_attn.q, blocks.N.ffn.0, ...): a target
// matches a projection whose name equals it or ends with "." + the target.
//
// Like FP8 (fp8.h), LoRA is numerics the model is told of through its LinearFn hooks:
// apply_lora() wraps the linear function each block already has (plain, or FP8) and adds the
// adapter's term for the projection being multiplied, which it recognises by its weight tensor.
// The model knows nothing of it, and the trainer hands the adapters to parallelize() as the
// parameters it trains: AdamW, the EMA, gradient reductions and checkpoints see A and B only,
// and every base weight is frozen (requires_grad false; the targeted weights optionally stored
// in bf16, or in FP8 e4m3 with a scale per output row and multiplied as fp32, lora.base_dtype).
//
// Names and files. The adapters are named after their projection: "blocks.N.self_attn.q.lora_A.weight"
// and ".lora_B.weight" (a run's checkpoints hold these). lora_file_tensors() gives the adapter
// file diffusers' WanPipeline.load_lora_weights and ComfyUI both read for Wan 2.1: the same names
// behind "diffusion_model.", plus a scalar ".alpha" per projection (both readers scale by
// alpha / rank, rank = lora_A's rows). merge_lora() folds adapters into whole weights
// (W += s B A) for sampling and for exporting a merged model.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/dit.h"

namespace vidit {

// The official names of the projections in `model`'s blocks that `targets` match, in the model's
// order. `targets` as lora.targets.
std::vector<std::string> lora_matches(const DiTImpl& model, const std::vector<std::string>& targets);

// Adds adapters to the projections lora.targets match (throws vidit::Error naming the targets and
// listing the projections there are when they match none), freezes every parameter of `model`,
// stores the targeted weights in lora.base_dtype, and returns the adapters by name (fresh leaves
// on the model's device, requiring grad). Call after the model is on its device and after
// apply_fp8(), whose linear functions it wraps. Uses LibTorch's default generator for A (seed it
// first for a reproducible start).
TensorMap apply_lora(DiTImpl& model, const LoraConfig& cfg);

// What LoRA adds and freezes for a model shape, counted without building it (`vidit plan`):
// the adapters' parameters, and the elements of the targeted (frozen) projection weights.
struct LoraCounts {
  int64_t adapter_params = 0, adapted_weights = 0, projections = 0;
  int64_t adapted_rows = 0;  // output rows of the targeted projections (fp8's row scales)
};
LoraCounts lora_counts(const ModelConfig& model, const LoraConfig& cfg);

// alpha / rank, with lora.alpha = 0 meaning alpha = rank.
double lora_scale(const LoraConfig& cfg);

// The model's own weights by official name, with the targeted weights as fp32 where they are
// stored in fp8 (lora.base_dtype = "fp8": e4m3 values times their row scales); others as stored.
// What merge_lora takes as the base of a live LoRA model.
TensorMap lora_base_weights(const DiTImpl& model);

// Whether `tensors` are a run's adapters (any key ending in ".lora_A.weight").
bool holds_lora(const TensorMap& tensors);

// `base` (whole weights, official names) with every adapter of `adapters` folded in:
// W + scale * B A, computed in fp32 and stored in W's dtype. Throws naming an adapter whose
// projection `base` lacks or whose shapes do not fit it. `base` is not modified.
TensorMap merge_lora(const TensorMap& base, const TensorMap& adapters, double scale);

// The same one weight at a time, for a base read tensor by tensor (train/run_weights.h):
// lora_pairs() finds and checks the adapters up front, merge_lora_weight() folds one in.
struct LoraPair {
  at::Tensor A;  // [r, in]
  at::Tensor B;  // [out, r]
};
// The adapters of `adapters` by the weight they adapt ("<projection>.weight"), checked against
// `base` (of which only names and shapes are read: meta tensors will do). Throws as merge_lora
// does: naming a projection with lora_A but no lora_B, one that `base` lacks, or one whose A and B
// do not fit its weight.
std::map<std::string, LoraPair> lora_pairs(const TensorMap& adapters, const TensorMap& base);
// `W` (of the shape its pair was checked against; any dtype and device) + scale * B A, computed
// in fp32 and stored in W's dtype: bit for bit what merge_lora gives for it. `W` is not modified;
// besides it, at most two fp32 tensors of its size are held at once (the result among them when
// W is fp32).
at::Tensor merge_lora_weight(const at::Tensor& W, const LoraPair& adapter, double scale);

// The adapter file for diffusers and ComfyUI: "diffusion_model.<projection>.lora_A.weight",
// ".lora_B.weight" (in `dtype`) and ".alpha" (a 0-d fp32 tensor: rank * scale).
TensorMap lora_file_tensors(const TensorMap& adapters, double scale, at::ScalarType dtype = at::kFloat);

// The other way: adapters by our names from a file in that layout ("lora_A" / "lora_B" or
// "lora_down" / "lora_up", with or without the "diffusion_model." prefix, ".alpha" optional), each
// projection's alpha / rank folded into its B, so that they apply with a scale of 1. Throws
// naming `source` and the key that fits neither.
TensorMap lora_from_file_tensors(const TensorMap& file, const std::string& source);

}  // namespace vidit
