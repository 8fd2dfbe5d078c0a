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
// whole parameters. Each member writes its own parts to checkpoints (train/checkpoint.h records
// the split dims); they load whole, and part_of cuts them for any mesh.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

#include "core/safetensors.h"
#include "dist/comm.h"
#include "dist/mesh.h"
#include "model/dit.h"

namespace vidit {

class TensorParallel {
 public:
  // Slices `model`'s parameters (which must be whole and equal on every member) and installs the
  // hooks. Not collective.
  TensorParallel(DiTImpl& model, const Mesh& mesh);

  int degree() const { return T_; }
  // 0 (rows) or 1 (columns) for a parameter split over the group, -1 for a replicated one.
  int split_dim(const std::string& name) const;
  // Whole tensors from this member's parts (collective over "tensor"). Keys are parameter names,
  // optionally behind a prefix ("exp_avg/<name>"); other keys are copied as they are.
  TensorMap gather_whole(const TensorMap& parts) const;
  // This member's parts of whole tensors (same key rules); a split tensor must have its whole
  // parameter's shape.
  TensorMap part_of(const TensorMap& whole) const;
  // The parameters' whole shapes (empty meta tensors), e.g. to check a checkpoint against.
  const TensorMap& whole_params() const { return whole_; }
  // Global L2 norm of the gradients of `params` (this member's parts, or FSDP shards of them:
  // `sq_replicated` / `sq_split` are their sums of squares, already summed over any other group
  // that splits them), summed once over the group: sqrt(sq_replicated + sum_tensor(sq_split)).
  double global_norm(double sq_replicated, double sq_split) const;
  // Clips this member's gradients to a global norm of max_norm (0: no clipping); returns the norm.
  double clip_grad_norm(const TensorMap& params, double max_norm) const;

 private:
  std::shared_ptr<Comm> tp_;
  int T_ = 1, rank_ = 0;
  std::map<std::string, int> split_;
  TensorMap whole_;
  // The parameter name behind `key`, or "" when it names none.
  std::string param_of(const std::string& key) const;
};

// Tensor parallel when parallel.tensor > 1 (nullptr otherwise).
std::unique_ptr<TensorParallel> apply_tensor_parallel(DiTImpl& model, const Mesh& mesh);

// The differentiable collectives, over `comm` (exposed for tests):
// identity forward, all-reduce (sum) of the gradient backward;
at::Tensor tp_enter(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// all-reduce (sum) forward, identity backward;
at::Tensor tp_combine(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// all-reduce (sum) forward and backward.
at::Tensor tp_sum(const at::Tensor& x, const std::shared_ptr<Comm>& comm);

}  // namespace vidit
