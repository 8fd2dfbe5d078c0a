#include "parallel/timed_comm.h"

#include <algorithm>

#include "core/trace.h"

namespace vidit {
namespace {


double bus_factor(const char* op, int n) {
  const std::string o = op;
  if (o == "all_reduce") return 2.0 * (n - 1) / n;
  if (o == "all_gather" || o == "reduce_scatter" || o == "all_to_all") return double(n - 1) / n;
  return 1.0;
}

// "wait all_gather": what a profile calls the wait of a collective (diagnose/profile.h counts
// these as communication).
const char* wait_name(const std::string& op) {
  static const std::map<std::string, std::string> names = [] {
    std::map<std::string, std::string> m;
    for (const char* o : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"})
      m[o] = std::string("wait ") + o;
    return m;
  }();
  const auto it = names.find(op);
  return it == names.end() ? "wait" : it->second.c_str();
}

// Marks this rank as waiting in a collective since `t0_us` while it lives (TimedComm::blocked_s).
class Blocked {
 public:
  Blocked(std::atomic<double>& since, double t0_us) : since_(since) { since_.store(std::max(t0_us, 1.0)); }
  ~Blocked() { since_.store(0); }

 private:
  std::atomic<double>& since_;
};

// Records its wait into the shared totals (and the trace) once, at the first wait() or at
// destruction.
class TimedWork : public Work {
 public:
  TimedWork(WorkPtr inner, const char* op, double bytes, int ranks, double issued_us,
            std::shared_ptr<TimedComm::Shared> shared, std::string group, int gpu)
      : inner_(std::move(inner)), op_(op), bytes_(bytes), ranks_(ranks), issued_us_(issued_us),
        shared_(std::move(shared)), group_(std::move(group)), gpu_(gpu) {}
  ~TimedWork() override {
    try {
      wait();
    } catch (...) {  // the engine's own Work reports failures to whoever waits; nobody does here
    }
  }
  void wait() override {
    if (done_) return;
    const double t0 = trace::now_us();
    shared_->issued.fetch_add(1, std::memory_order_relaxed);
    const Blocked blocked(shared_->waiting_since_us, t0);
    // On a GPU the wait orders the current stream after the collective: events before and after
    // it tell how long the stream stood there.
    GpuEventPtr before = record_gpu_event(gpu_);
    {
      const trace::Annotation annotation(trace::annotating() ? wait_name(op_) : "");  // diagnose/profile.h
      inner_->wait();
    }
    GpuEventPtr after = record_gpu_event(gpu_);
    const double t1 = trace::now_us();
    done_ = true;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (before) shared_->gpu_waits.emplace_back(std::move(before), std::move(after));
      CommTimes::Entry& e = shared_->times.by_op[op_];
      e.calls += 1;
      e.wait_s += (t1 - t0) * 1e-6;
      e.bytes += bytes_;
      if (ranks_ > 1) {
        CommTimes::Traffic& g = shared_->times.by_group[group_][op_];
        g.calls += 1;
        g.bus_bytes += bytes_ * bus_factor(op_, ranks_);
        // The union of the calls' spans: calls in flight together (buckets, prefetches) count
        // their common time once. Calls end in about the order they were issued.
        g.span_s += std::max(0.0, t1 - std::max(issued_us_, g.last_end_us)) * 1e-6;
        g.last_end_us = std::max(g.last_end_us, t1);
        g.wait_s += (t1 - t0) * 1e-6;
      }
    }
    if (trace::on()) {
      trace::async_slice(op_, "comm", issued_us_, t1 - issued_us_, {{"bytes", bytes_}, {"ranks", double(ranks_)}});
      trace::slice(std::string("wait ") + op_, "comm_wait", t0, t1 - t0, {{"bytes", bytes_}});
    }
  }

 private:
  WorkPtr inner_;
  const char* op_;
  double bytes_;
  int ranks_;
  double issued_us_;
  std::shared_ptr<TimedComm::Shared> shared_;
  std::string group_;  // the communicator's mesh group
  int gpu_;            // CUDA device of the tensors, or -1
  bool done_ = false;
};

}  // namespace

double TimedComm::take_gpu_stall_s() {
  std::vector<std::pair<GpuEventPtr, GpuEventPtr>> waits;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    waits.swap(shared_->gpu_waits);
  }
  double s = 0;
  for (const auto& [before, after] : waits) s += gpu_seconds_between(before, after);
  return s;
}

double TimedComm::blocked_s() const {
  const double since = shared_->waiting_since_us.load();
  return since > 0 ? std::max(0.0, trace::now_us() - since) * 1e-6 : 0.0;
}

double CommTimes::wait_s() const {
  double s = 0;
  for (const auto& [op, e] : by_op) s += e.wait_s;
  return s;
}

TimedComm::TimedComm(std::shared_ptr<Comm> inner) : TimedComm(std::move(inner), std::make_shared<Shared>()) {}

TimedComm::TimedComm(std::shared_ptr<Comm> inner, std::shared_ptr<Shared> shared)
    : ForwardingComm(std::move(inner)), shared_(std::move(shared)) {}

CommTimes TimedComm::times() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->times;
}

void TimedComm::reset() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->times = CommTimes{};
}

int TimedComm::gpu_of(const at::Tensor& t) const {
  return t.is_cuda() ? int(t.get_device()) : shared_->engine_gpu.load();
}

WorkPtr TimedComm::timed(const char* op, double bytes, WorkPtr work, double issued_us, int gpu) {
  return std::make_shared<TimedWork>(std::move(work), op, bytes, size(), issued_us, shared_, group_, gpu);
}

WorkPtr TimedComm::all_reduce(at::Tensor& t, ReduceOp op) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("all_reduce", double(t.nbytes()), inner_->all_reduce(t, op), t0, gpu_of(t));
}
WorkPtr TimedComm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("all_gather", double(out.nbytes()), inner_->all_gather(in, out), t0, gpu_of(in));
}
WorkPtr TimedComm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("reduce_scatter", double(in.nbytes()), inner_->reduce_scatter(in, out, op), t0, gpu_of(in));
}
WorkPtr TimedComm::all_to_all(const at::Tensor& in, at::Tensor& out) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("all_to_all", double(in.nbytes()), inner_->all_to_all(in, out), t0, gpu_of(in));
}
WorkPtr TimedComm::broadcast(at::Tensor& t, int root) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("broadcast", double(t.nbytes()), inner_->broadcast(t, root), t0, gpu_of(t));
}
WorkPtr TimedComm::send(const at::Tensor& t, int dst, int tag) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("send", double(t.nbytes()), inner_->send(t, dst, tag), t0, gpu_of(t));
}
WorkPtr TimedComm::recv(at::Tensor& t, int src, int tag) {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  return timed("recv", double(t.nbytes()), inner_->recv(t, src, tag), t0, gpu_of(t));
}
void TimedComm::barrier() {
  const double t0 = trace::now_us();
  shared_->issued.fetch_add(1, std::memory_order_relaxed);
  const Blocked blocked(shared_->waiting_since_us, t0);
  inner_->barrier();
  const double t1 = trace::now_us();
  std::lock_guard<std::mutex> lock(shared_->mu);
  CommTimes::Entry& e = shared_->times.by_op["barrier"];
  e.calls += 1;
  e.wait_s += (t1 - t0) * 1e-6;
  if (trace::on()) trace::slice("barrier", "comm_wait", t0, t1 - t0);
}
std::shared_ptr<Comm> TimedComm::split(int color, int key) {
  return std::shared_ptr<Comm>(new TimedComm(inner_->split(color, key), shared_));
}

}  // namespace vidit
