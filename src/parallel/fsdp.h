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
//  - at most two units' reductions are in flight: starting a third first finishes the oldest
//    (waits for it, sums the shares over the sp group (sequence parallel), averages over
//    "replicate" (HSDP) and adds the result to the shards' .grad, freeing its packed
//    gradients), so a member never holds more than two units' whole gradients at once, not the
//    whole model's; after_backward() (every micro-batch) finishes the rest.
// Freed weights keep their tensors (autograd holds them) with their storage released; gathering
// refills the same storage, so saved tensors see the data again.
//
// What travels in a gather: every weight in parallel.gather_dtype (fp32, or bf16: half the
// bytes, and the values bf16 autocast multiplies by anyway), and with FP8 training
// (parallel.fp8_all_gather) the blocks' FP8 projection weights in e4m3, 1 byte each. Their
// owners quantise them: when a forward starts, each member finds the largest magnitude of its
// part of each FP8 weight (per weight, or per row in the rowwise recipe), one all-reduce (max)
// over "shard" agrees on them, and each member casts its shard with the scales to_fp8 would
// give the whole weight. The gathered e4m3 copy is handed to fp8_linear in place of the weight
// (model/fp8.h), whose own storage is then never filled: the result is bitwise that of gathering
// fp32 and casting there, for a quarter of the bytes on the wire and in memory.
//
// The model knows nothing of this; its own parameters hold no memory between uses. The shards'
// layout (a Flat cut, layout.h) is what checkpoints, the gradient norm and weight gathering read,
// so a checkpoint loads at any mesh.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "model/dit.h"

namespace vidit {

// What a gather sends (from parallel.gather_dtype, parallel.fp8_all_gather, train.precision and
// train.fp8_fast_accum: gather_options()).
struct GatherOptions {
  at::ScalarType dtype = at::kFloat;        // every weight but those below
  bool fp8 = false;                         // the blocks' FP8 projection weights in e4m3
  bool rowwise = false, fast_accum = false;  // the FP8 recipe they are multiplied with
};
GatherOptions gather_options(const Config& cfg);

class FullyShardedDataParallel : public GradientSync {
 public:
  // Collective over the mesh. A model with weights: broadcasts them from dp rank 0, keeps this
  // member's shards and frees the model's own parameter storage. A model built without storage
  // (model/param_storage.h): sends nothing and leaves the shards zero, for the caller to fill
  // (ParallelModel::init_parts, or this member's part of init_from); no member ever holds more
  // than one unit's gathered weights.
  FullyShardedDataParallel(DiTImpl& model, const Mesh& mesh, const ParallelConfig& cfg, GatherOptions gather = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // This member's shards, named like the model's parameters: 1-D fp32 leaves whose .grad holds
  // the reduced gradient after after_backward(). AdamW and the EMA run on these.
  const TensorMap& shards() const { return shard_map_; }
  // GradientSync: after each micro-batch's backward, finishes the reductions and accumulates
  // the shards' gradients.
  void after_backward(bool last) override { after_backward(); }
  void after_backward();
  // A forward without backward (no_grad) leaves the root unit, and with
  // reshard_after_forward = false every block, gathered: released here, so that the next
  // forward gathers the weights as they are after the optimizer step.
  void after_forward_only() override;

  // Bytes this member keeps between steps for parameters and gradients (shards, and the e4m3
  // casts of the FP8 ones), and the most
  // gathered at once during the last step (for the memory report).
  int64_t shard_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_; }
  // Bytes this member has put into all-gathers of weights so far (its shards as sent).
  int64_t gather_sent_bytes() const { return gather_sent_; }
  // How many weights are gathered in e4m3.
  int64_t fp8_weights() const { return int64_t(fp8_.size()); }

 private:
  struct Unit {
    std::vector<int> params;             // indices into params_
    std::vector<int64_t> offset, chunk;  // per param: place and length in the unit's shard
    int64_t shard_numel = 0;
    std::vector<int64_t> wire_offset;    // per param: byte offset of its chunk in what is sent
    int64_t wire_bytes = 0;              // what one member sends (each chunk padded to 4 bytes)
    bool gathered = false, keep = false;  // keep: root, or reshard_after_forward = false
    int ready = 0;                       // gradients produced in this backward
    bool reducing = false;               // its reduce-scatter is in flight
    bool reduced = false;                // ... and done, added to the shards' gradients
    at::Tensor gather_buf;               // [S * wire_bytes / 4] int32 while a gather is in flight
    WorkPtr gather_work;
    at::Tensor reduce_in;                // [S * shard_numel] the packed gradients, while in flight
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
  void finish_reduce(Unit& u);  // waits for u's reduce-scatter and adds it to the shards' gradients
  std::vector<int> in_flight_;  // units whose reduce-scatter is in flight, oldest first
  void quantize_fp8_shards();  // when a forward starts: scales agreed, shards cast (above)
  const at::Tensor& gathered(int param) const;  // where param's gathered values go

  // A weight gathered in e4m3.
  struct Fp8Weight {
    int param = -1;
    at::Tensor copy;   // [out, in] e4m3, filled and freed as the weight itself would be
    at::Tensor scale;  // [] or [out, 1] (rowwise), fp32, set by quantize_fp8_shards()
    at::Tensor shard;  // this member's chunk in e4m3, as bytes [chunk]
    int64_t start = 0; // the chunk's first element in the flattened weight
    int64_t valid = 0; // elements of the chunk inside the weight (the rest is padding)
  };

  DiTImpl* model_;  // whose forward hooks drive the gathers (reset on destruction)
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
  TensorMap shard_map_;
  int64_t gathered_bytes_ = 0, peak_gathered_ = 0, gather_sent_ = 0;
  GatherOptions gather_;
  std::vector<int> fp8_of_;  // per param: index into fp8_, or -1
  std::vector<Fp8Weight> fp8_;
  // The blocks' projection functions before FSDP wrapped them (restored on destruction).
  std::vector<LinearFn> inner_linear_fns_;
};

// The cut FSDP over S shards gives every parameter: Flat over "shard".
std::vector<Cut> fsdp_cuts(int S);

// FSDP over the mesh's "shard" group: pm.params() become the shards, and every layout gets the
// Flat cut. With tensor parallel, apply it first: FSDP then shards each member's parts.
// Collective over the mesh; nothing when the degree is 1, unless cfg.apply_all.
void apply_fsdp(ParallelModel& pm, const Config& cfg);

}  // namespace vidit
