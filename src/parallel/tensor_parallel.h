// Tensor parallelism (Megatron-style) over the mesh's "tensor" group of T members: inside every
// block each member holds 1/T of the attention heads and of the MLP hidden units, and the
// activations between blocks stay whole on every member.
//
// apply_tensor_parallel(model, mesh) slices the model's parameters in place and sets its
// FeatureSplit hooks (model/layers.h); the model's code is unchanged:
//  - column split (rows of the weight, and the bias): self- and cross-attention q, k, v, their
//    QK RMSNorm scales, and the MLP's first layer. Heads are contiguous, so member t holds heads
//    [t H/T, (t+1) H/T).
//  - row split (columns of the weight): the attention output projections o and the MLP's second
//    layer. Each member's product is partial; one all-reduce per projection sums them, then the
//    (whole, replicated) bias is added.
//  - QK RMSNorm normalises over the full dim, so the per-member sums of squares are all-reduced
//    (a [B, L, 1] tensor; its backward all-reduces too).
//  - the input of the column-split projections (the block's normalised stream, and the text
//    context) is whole on every member; backward all-reduces its gradient.
//  - everything else (embeddings, modulation, norm3, head, biases of row-split layers) is
//    replicated; f / g above make its gradient whole and equal on every member, so it needs no
//    reduction over "tensor".
// Communication per block, forward: 3 all-reduces of [B, L, dim] (two o projections, MLP) and 4
// small ones (RMSNorm); backward: 3 all-reduces of [B, L, dim] (block input into self-attention,
// cross-attention q and MLP), one of [B, Lt, dim] (text context) and the 4 small ones.
//
// Members of a tensor group train on the same samples (their "dp" coordinate is equal); the
// gradient reduction over "dp" / "dpsp" and FSDP's sharding apply to each member's slices as to
// whole parameters. The splits are the parameters' layouts (layout.h): checkpoints, the
// gradient norm and weight gathering read them there.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

#include "core/safetensors.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "model/dit.h"

namespace vidit {

// The cut parallel.tensor = T gives parameter `name`: a Split over "tensor" along dim 0 (rows)
// or 1 (columns), or none (replicated).
std::vector<Cut> tensor_parallel_cuts(const std::string& name, int T);

// Splits the model's parameters over the mesh's "tensor" group (which must hold whole, equal
// weights on every member), installs the hooks and records the cuts in the layouts. Not
// collective; nothing when the degree is 1, unless cfg.apply_all.
void apply_tensor_parallel(ParallelModel& pm, const ParallelConfig& cfg);

// The differentiable collectives, over `comm` (exposed for tests):
// identity forward, all-reduce (sum) of the gradient backward;
at::Tensor tp_enter(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// all-reduce (sum) forward, identity backward;
at::Tensor tp_combine(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// all-reduce (sum) forward and backward.
at::Tensor tp_sum(const at::Tensor& x, const std::shared_ptr<Comm>& comm);

}  // namespace vidit
