// Data parallel (DDP): every rank of the "dp" group holds the whole model, trains on its own part
// of the global batch, and after backward the gradients are averaged over the group so every
// rank takes the same optimizer step.
//
// Gradients travel in buckets (flat buffers of about `bucket_bytes`, parameters in reverse
// registration order, roughly the order backward finishes them): fewer, larger messages. During
// the last micro-batch's backward a hook fires as each parameter's gradient is final (after
// accumulation); when a bucket's gradients are all final its all-reduce is launched at once
// (asynchronously) while backward goes on with earlier layers. finish() launches what is left
// (parameters that got no gradient count as zero), waits, and writes the averages into .grad.
//
// The model knows nothing of this: as a GradientSync (parallel_model.h) it runs begin() before
// the last micro-batch's backward and finish() after it.
//
// With sequence parallelism (sequence_parallel.h) the group is "dpsp": the members of one sp
// group hold shares of one sample's gradient, which add up, and the dp groups' results are
// averaged; so the reduction is a sum divided by the dp degree (`divisor`), not by the group size.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"

namespace vidit {

class DataParallel : public GradientSync {
 public:
  // Broadcasts the parameters from dp rank 0 (replicas start identical) and installs the hooks.
  // `params` are leaf tensors that require grad; they outlive this object.
  // The reduced gradient is the sum over the group divided by `divisor` (0: the group's size, a
  // plain average).
  DataParallel(std::vector<at::Tensor> params, std::shared_ptr<Comm> dp, int64_t bucket_bytes = 25 << 20,
               double divisor = 0);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Arms the hooks for the backward pass that completes the gradients (the last micro-batch).
  void begin();
  // Launches the remaining buckets, waits for all, writes the averaged gradients. Every rank
  // must call it once per step.
  void finish();

  // GradientSync: the last micro-batch's backward launches the buckets, and they are waited for
  // after it.
  void before_backward(bool last) override {
    if (last) begin();
  }
  void after_backward(bool last) override {
    if (last) finish();
  }

  const std::shared_ptr<Comm>& comm() const { return dp_; }
  int64_t buckets() const { return int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<int> params;  // indices into params_
    std::vector<int64_t> offsets;
    at::Tensor flat;
    int ready = 0;
    WorkPtr work;
  };
  void on_grad_ready(int param);
  void launch(Bucket& b);

  std::vector<at::Tensor> params_;
  std::shared_ptr<Comm> dp_;
  double divisor_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  size_t next_launch_ = 0;  // buckets are launched in index order
  bool armed_ = false;
};

// Gradient reduction for the mesh: over "dp" (replicate x shard), or over "dpsp" when tokens are
// split too, in buckets of parallel.bucket_mb, of pm.params(). Members of a tensor-parallel
// group reduce their own parts in their own groups (which never mix tensor coordinates).
// Nothing for a 1-member group, except in a one-process launch over a real engine (e.g. NCCL on
// one GPU), which then runs the bucket all-reduces a cluster runs.
void apply_data_parallel(ParallelModel& pm, const ParallelConfig& cfg);

}  // namespace vidit
