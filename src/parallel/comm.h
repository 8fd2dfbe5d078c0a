// The communicator: a group of processes and the collectives among them. Small on purpose; every
// parallelism (data parallel, FSDP, tensor, Ulysses, ring) is written against it.
//
// Engines: MPI over CPU tensors (comm_mpi.cpp, when built with VIDIT_HAVE_MPI), c10d's gloo and
// NCCL process groups for torchrun launches (comm_c10d.cpp), and the single-process communicator
// (size 1, every collective an identity). ForwardingComm passes every call to another
// communicator: TimedComm (waits), CountingComm (bytes) and the tests' fault injection build on it.
//
// Contracts shared by every method:
//  - the engines move contiguous tensors of their own device (MPI, gloo: CPU; NCCL: CUDA); the
//    world communicator puts every engine behind a StagingComm (staging_comm.h), so callers hand
//    over tensors on any device and in any layout; fp32, fp64, bf16, fp16, int32 and int64 move;
//    reductions of bf16/fp16 are done in fp32 and rounded once;
//  - the same collectives are called in the same order on every member (MPI semantics); a
//    communicator is used by one thread at a time;
//  - the asynchronous calls return a Work; the tensors must not be touched until wait() returns;
//    the Work keeps them alive; destroying an unwaited Work waits;
//  - a failure of the engine throws vidit::Error naming the operation. A member that dies is
//    detected by the launcher (mpirun / srun end the job); see abort_world().
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>

#include "parallel/launch_env.h"

namespace vidit {

enum class ReduceOp { Sum, Avg, Max };

// Completion of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete and its outputs are final. Idempotent.
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (after running `finish`, if given, at wait()).
WorkPtr completed_work(std::function<void()> finish = {});

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "gloo", "nccl" or "single"

  // In place on every member: t = op(t over members).
  virtual WorkPtr all_reduce(at::Tensor& t, ReduceOp op) = 0;
  // out [size * n, ...] = concatenation along dim 0 of every member's in [n, ...], in rank order.
  virtual WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) = 0;
  // in [size * n, ...]: member r receives out [n, ...] = op over members of in's r-th block.
  virtual WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) = 0;
  // in [size * n, ...]: block j goes to member j; out [size * n, ...]: block j came from member j.
  virtual WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) = 0;
  // t on every member = t on `root`.
  virtual WorkPtr broadcast(at::Tensor& t, int root) = 0;
  // Point to point; `t` on the receiver has the sender's shape and dtype.
  virtual WorkPtr send(const at::Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(at::Tensor& t, int src, int tag = 0) = 0;
  virtual void barrier() = 0;
  // Collective over this communicator: members with the same `color` form a new communicator,
  // ranked by `key` (ties by the old rank).
  virtual std::shared_ptr<Comm> split(int color, int key) = 0;
};

// Passes every call to `inner`; override a method to inject a fault.
class ForwardingComm : public Comm {
 public:
  explicit ForwardingComm(std::shared_ptr<Comm> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override { return inner_->all_reduce(t, op); }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override { return inner_->all_gather(in, out); }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override { return inner_->all_to_all(in, out); }
  WorkPtr broadcast(at::Tensor& t, int root) override { return inner_->broadcast(t, root); }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  void barrier() override { inner_->barrier(); }
  std::shared_ptr<Comm> split(int color, int key) override { return inner_->split(color, key); }

 protected:
  std::shared_ptr<Comm> inner_;
};

// For the engines: bf16 / fp16 are reduced in an fp32 copy (every engine gives the same sums);
// Avg of a tensor that is not floating point is refused, naming the operation.
bool reduces_in_fp32(at::ScalarType t);
void check_average(const at::Tensor& t, ReduceOp op, const char* name);

// A communicator as an integer, for autograd functions (their saved_data holds IValues only);
// whoever installs the function keeps the communicator alive.
inline int64_t comm_address(const std::shared_ptr<Comm>& c) { return int64_t(reinterpret_cast<intptr_t>(c.get())); }
inline Comm& comm_at(int64_t address) { return *reinterpret_cast<Comm*>(address); }

// Size 1: every collective is an identity (copies where input and output differ).
std::shared_ptr<Comm> make_single_comm();

// The world communicator for this launch: the single-process one when env.world == 1, else the
// engine VIDIT_COMM names ("mpi", "gloo" or "nccl"), or by default: "nccl" when the tensors live
// on CUDA; "mpi" for processes started by mpirun or srun (initialised here; its rank and size
// must agree with `env`, or this throws naming both); "gloo" for torchrun's (comm_c10d.h). The
// engine is behind the device rule (staging_comm.h): it accepts tensors on any device.
// Throws, saying what to install or set, when the engine is not in this build.
std::shared_ptr<Comm> make_world_comm(const LaunchEnv& env, at::DeviceType device = at::kCPU);

// True when this build has MPI.
bool have_mpi();

// Ends every process of the job with `code` (MPI_Abort) when MPI runs with more than one
// process; otherwise does nothing and returns. For a fatal error on one rank: the others may be
// blocked in a collective and would otherwise wait forever.
void abort_world(int code);

}  // namespace vidit
