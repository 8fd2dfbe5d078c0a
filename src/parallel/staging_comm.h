// The one device rule of the collectives: every communicator accepts tensors on any device, in
// any layout. StagingComm sits in front of an engine that moves tensors of one device only (MPI
// and gloo: CPU memory; NCCL: the current CUDA device) and copies every other tensor there and
// back: a CPU scalar handed to NCCL (the step's loss and sample totals, a batch share, the
// slowest rank, RNG states at a save) goes through the GPU, a CUDA tensor handed to MPI through
// host memory; a non-contiguous tensor becomes a contiguous copy. Outputs are copied back when
// the Work is waited for, so callers see the engine-independent contract of comm.h.
//
// Tensors already on the engine's device and contiguous pass through untouched (no copy on the
// hot path: FSDP gathers, data-parallel buckets and sequence-parallel exchanges hand over
// tensors of the training device). Sub-communicators from split() stage the same way.
//
// make_world_comm() wraps every engine in one, so no call site checks a device.
#pragma once
#include <memory>

#include "parallel/comm.h"

namespace vidit {

class StagingComm : public ForwardingComm {
 public:
  // `device`: the only device `engine` moves (at::kCPU, or at::kCUDA for the current GPU).
  StagingComm(std::shared_ptr<Comm> engine, at::Device device);
  const at::Device& device() const { return device_; }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override;
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override;
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override;
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override;
  WorkPtr broadcast(at::Tensor& t, int root) override;
  WorkPtr send(const at::Tensor& t, int dst, int tag) override;
  WorkPtr recv(at::Tensor& t, int src, int tag) override;
  std::shared_ptr<Comm> split(int color, int key) override;

 private:
  bool fits(const at::Tensor& t) const;
  at::Tensor staged(const at::Tensor& t) const;  // t itself when it fits, else a copy on device_
  at::Tensor staged_output(const at::Tensor& t) const;  // t, or an uninitialised tensor on device_
  // The engine's work, then (when `out` was staged) its result copied into `out`.
  WorkPtr copy_back(WorkPtr work, at::Tensor staged, at::Tensor out) const;
  at::Device device_;
};

// `engine` behind a StagingComm for its device: `gpu` for "nccl", the CPU for the others; the
// single-process communicator (whose collectives are identities) is returned as it is.
std::shared_ptr<Comm> with_device_rule(std::shared_ptr<Comm> engine, at::Device gpu);

}  // namespace vidit
