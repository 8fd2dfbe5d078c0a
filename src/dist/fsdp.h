// Fully sharded data parallel (FSDP, ZeRO-3) over the mesh's "shard" group; with a "replicate"
// group too, HSDP. Each member keeps 1/S of every parameter (its flattened elements, padded to a
// multiple of S, split in S equal chunks), of its gradient and, because AdamW and the EMA run on
// these shards, of the optimizer state and EMA weights.
//
// Units: one per DiT block, and a root unit with the other parameters (embeddings, head). The
// model's forward hooks (model/dit.h ForwardHooks) drive the gathering:
//  - root: all-gathered when the forward starts; kept until its gradients are done;
//  - block i: all-gathered before its forward (waiting for a prefetch issued one block earlier,
//    so the gather of block i+1 overlaps block i's compute; parallel.prefetch = false issues
//    each gather only when its block starts, for comparison), freed after its forward when
//    parallel.reshard_after_forward (else kept for backward), and gathered again when backward
//    reaches the block's output, prefetching block i-1;
//  - when backward has produced all of a unit's gradients, they are packed and reduce-scattered
//    asynchronously (averaged over "shard", in parallel.reduce_dtype), the unit's gathered
//    weights and full gradients are freed, and backward goes on;
//  - after_backward() (every micro-batch) waits for the reductions, sums the shares over the
//    sp group (sequence parallel) and averages over "replicate" (HSDP), and adds the result to
//    the shards' .grad.
// Freed weights keep their tensors (autograd holds them) with their storage released; gathering
// refills the same storage, so saved tensors see the data again.
//
// The model knows nothing of this; its own parameters hold no memory between uses. Checkpoints
// are written in parts, one per shard (train/checkpoint.h), and read back whole; shard_of()
// slices whole tensors for this member, so a checkpoint loads at any mesh.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "dist/mesh.h"
#include "dist/tensor_parallel.h"
#include "model/dit.h"

namespace vidit {

class FullyShardedDataParallel {
 public:
  // Collective over the mesh: broadcasts the weights from dp rank 0, keeps this member's shards
  // and frees the model's own parameter storage.
  FullyShardedDataParallel(DiTImpl& model, const Mesh& mesh, const ParallelConfig& cfg);
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // This member's shards, named like the model's parameters: 1-D fp32 leaves whose .grad holds
  // the reduced gradient after after_backward(). AdamW and the EMA run on these.
  const TensorMap& shards() const { return shard_map_; }
  // The model parameters the shards belong to (shapes, and the weight-decay decision).
  const TensorMap& full_params() const { return full_map_; }

  // After each micro-batch's backward: finishes the reductions and accumulates shard gradients.
  void after_backward();
  // Clips the shards' gradients to a global L2 norm (over the whole model) of max_norm (0: no
  // clipping); returns the norm before clipping. With tensor parallel (`tp`), the shards are of
  // each member's parts, and the split parts' squares are summed over the tensor group too.
  double clip_grad_norm(double max_norm, const TensorParallel* tp = nullptr);

  // Whole tensors from shard-shaped ones (collective over "shard"). Keys are parameter names,
  // optionally behind a prefix ("exp_avg/<name>"); other keys pass through unchanged.
  TensorMap gather_full(const TensorMap& sharded) const;
  // This member's shards of whole tensors (same key rules): loading at any mesh.
  TensorMap shard_of(const TensorMap& full) const;

  // Bytes this member keeps between steps for parameters and gradients (shards), and the most
  // gathered at once during the last step (for the memory report).
  int64_t shard_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_; }

 private:
  struct Unit {
    std::vector<int> params;             // indices into params_
    std::vector<int64_t> offset, chunk;  // per param: place and length in the unit's shard
    int64_t shard_numel = 0;
    bool gathered = false, keep = false;  // keep: root, or reshard_after_forward = false
    int ready = 0;                       // gradients produced in this backward
    bool reducing = false;
    at::Tensor gather_buf;               // [S * shard_numel] while a gather is in flight
    WorkPtr gather_work;
    at::Tensor reduce_out;               // [shard_numel]
    WorkPtr reduce_work;
  };
  void prefetch(int unit);  // starts unit's gather early (parallel.prefetch)
  void end_backward_slice();  // the trace's "block i backward" slice
  void start_gather(Unit& u);
  void finish_gather(Unit& u);
  void ensure_gathered(int unit);
  void release(Unit& u);
  void on_grad_ready(int param);
  void start_reduce(Unit& u);
  // f(tensor, its parameter) for the keys that name a parameter; the others copied as they are.
  TensorMap map_params(const TensorMap& in,
                       const std::function<at::Tensor(const at::Tensor&, const at::Tensor& param)>& f) const;

  std::shared_ptr<Comm> shard_, replicate_, sp_;
  int S_ = 1, rank_ = 0;
  bool reduce_bf16_ = false;
  bool prefetch_ = true;
  double forward_start_us_ = -1, backward_start_us_ = -1;  // trace slices of the current block
  int backward_block_ = -1;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;  // the model's parameters (storage freed between uses)
  std::vector<int> unit_of_;
  std::vector<Unit> units_;         // units_[0] is the root; units_[1 + i] is block i
  TensorMap shard_map_, full_map_;
  int64_t gathered_bytes_ = 0, peak_gathered_ = 0;
};

// FSDP when parallel.shard > 1 (nullptr otherwise). With tensor parallel, apply it first: FSDP
// then shards each member's parts.
std::unique_ptr<FullyShardedDataParallel> apply_fsdp(DiTImpl& model, const Mesh& mesh, const ParallelConfig& cfg);

}  // namespace vidit
