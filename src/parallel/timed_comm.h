// A communicator that measures how long its caller is blocked in each collective: the time from
// entering a Work's wait() to its return, summed by collective name over every group split from
// it. That is the communication a step did not hide behind compute ("exposed"); a collective
// issued early (the FSDP prefetch, ring attention's next K/V hop, data-parallel buckets) and
// done by the time it is waited for costs nothing here. The Mesh wraps the world communicator in
// one, so every parallelism is measured; the trainer logs the exposed time per step.
//
// With the trace on (core/trace.h), each collective is also recorded as an asynchronous slice
// from issue to the end of its wait, and each wait as a slice on the waiting thread.
//
// Each communicator also carries the name of its mesh group (set_group; "world" by default), and
// the totals keep, per group and collective, the bytes moved and the time from issue to the end
// of the wait: diagnose/group_bandwidth.h turns them into a bus bandwidth per group and names a
// group that is slower than the others of its kind (a slow link).
//
// On CPU engines wait() blocks the thread until the data has arrived. On NCCL it only orders the
// current CUDA stream after the collective, so the figure there is host-side time, not GPU time;
// for CUDA tensors each wait() therefore also records a CUDA event on the current stream before
// and after it, and take_gpu_stall_s() reads how long the stream stood at those waits (what the
// trainer subtracts from the step's span on the device to get its busy time).
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/gpu_events.h"
#include "parallel/comm.h"

namespace vidit {

struct CommTimes {
  struct Entry {
    int64_t calls = 0;
    double wait_s = 0;  // blocked in wait()
    double bytes = 0;   // tensor bytes handed to the collective (output for all-gather)
  };
  std::map<std::string, Entry> by_op;
  double wait_s() const;  // over every collective
  // Per mesh group, per collective: what crossed the links. Bus bytes are the tensor bytes
  // scaled as nccl-tests scale them, so one figure compares groups of any size: all-reduce
  // 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, broadcast and point to point 1.
  struct Traffic {
    int64_t calls = 0;
    double bus_bytes = 0;
    double span_s = 0;  // time with one of them in flight: from issue to the end of its wait
    double wait_s = 0;  // time blocked in their wait()s
    double last_end_us = 0;
  };
  std::map<std::string, std::map<std::string, Traffic>> by_group;
};

class TimedComm : public ForwardingComm {
 public:
  explicit TimedComm(std::shared_ptr<Comm> inner);

  // A copy of the totals since construction or the last reset (shared with every split).
  CommTimes times() const;
  void reset();

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override;
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override;
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override;
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override;
  WorkPtr broadcast(at::Tensor& t, int root) override;
  WorkPtr send(const at::Tensor& t, int dst, int tag) override;
  WorkPtr recv(at::Tensor& t, int src, int tag) override;
  void barrier() override;
  std::shared_ptr<Comm> split(int color, int key) override;
  // The mesh group this communicator is (parallel/mesh.h names them after split()).
  void set_group(std::string name) { group_ = std::move(name); }
  // The GPU an engine stages other tensors through (NCCL: CPU scalars go through it, and the
  // stream waits for them too), or -1; shared with every split.
  void set_engine_gpu(int gpu) { shared_->engine_gpu = gpu; }
  const std::string& group() const { return group_; }

  // Collectives (and point-to-point calls) entered on this rank, over every group: safe to read
  // from any thread. Every rank of an SPMD job enters the same sequence, so the rank with the
  // lowest count when a job hangs is the one the others wait for (resilience/watchdog.h).
  int64_t issued() const { return shared_->issued.load(std::memory_order_relaxed); }
  // How long the wait() (or barrier) this rank is blocked in now has lasted, in seconds; 0 when
  // it is not in one. Safe from any thread: the watchdog writes a heartbeat when a wait grows
  // long, so a restart can tell the rank that never arrived from those that waited for it.
  double blocked_s() const;
  // GPU time the current streams stood at wait()s of collectives on CUDA tensors since the last
  // call, over every group: blocks until those events have happened. 0 without CUDA.
  double take_gpu_stall_s();

  struct Shared {
    std::mutex mu;
    CommTimes times;
    std::atomic<int64_t> issued{0};
    std::atomic<double> waiting_since_us{0};  // 0: not in a wait
    std::vector<std::pair<GpuEventPtr, GpuEventPtr>> gpu_waits;  // (before, after) each wait, under mu
    std::atomic<int> engine_gpu{-1};
  };

 private:
  TimedComm(std::shared_ptr<Comm> inner, std::shared_ptr<Shared> shared);
  // The GPU whose stream a wait on `t` holds up (its own, or the staging engine's), or -1.
  int gpu_of(const at::Tensor& t) const;
  // gpu: the CUDA device of the collective's tensors, or -1.
  WorkPtr timed(const char* op, double bytes, WorkPtr work, double issued_us, int gpu);
  std::shared_ptr<Shared> shared_;
  std::string group_ = "world";
};

}  // namespace vidit
