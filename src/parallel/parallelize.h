// parallelize(): the single-device model to the model a mesh trains (parallel_model.h), the one
// place that composes the parallelisms. It applies, in this order:
//   1. tensor parallel (tensor_parallel.h)    splits each block's heads and MLP units over
//                                             "tensor": the split parameters' layouts get a
//                                             Split cut;
//   2. sequence parallel (sequence_parallel.h) splits each sample's tokens over "sp" (Ulysses,
//                                             ring): the model's attention and token hooks;
//   3. activation recompute (model/recompute.h) train.recompute_blocks: the blocks rerun their
//                                             forward (with the collectives above) in backward;
//   4. FSDP (fsdp.h) when parallel.shard > 1  shards every parameter over "shard" (a Flat cut;
//                                             params() become the shards), its gathers and
//                                             reduce-scatters driven by the model's hooks;
//      or data parallel (data_parallel.h)     averages the gradients over "dp" (x "sp").
// The order matters: tensor parallel cuts whole parameters and FSDP shards what each member
// holds; recompute must see the attention functions sequence parallel installed. Each step is
// a no-op at degree 1, so one process gets the same object with replicated layouts, unless
// parallel.apply_all asks for tensor parallel and FSDP at degree 1 too (a one-GPU check of their
// code over NCCL). A new parallelism is one file with its apply_*(ParallelModel&, ...) and one
// line below.
#pragma once
#include <memory>

#include "core/config.h"
#include "model/dit.h"
#include "parallel/activation_memory.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"

namespace vidit {

// Collective over the mesh (FSDP and data parallel broadcast rank 0's weights).
// `activations`: a block's measured activations, for train.memory_budget_gb (nullptr: the plan's formula).
// `trainable`: what the run trains when not the model's parameters (LoRA's adapters, model/lora.h;
// validate_config keeps tensor parallel and FSDP away from them, so data parallel reduces them).
std::unique_ptr<ParallelModel> parallelize(DiT model, std::shared_ptr<const Mesh> mesh, const Config& cfg,
                                           const BlockActivations* activations = nullptr, TensorMap trainable = {});

// The layouts parallelize() gives `whole` parameters (by name and shape) on a mesh of the
// config's degrees, without applying anything: what `vidit plan` counts.
Layouts planned_layouts(const TensorMap& whole, const ParallelConfig& p);

}  // namespace vidit
