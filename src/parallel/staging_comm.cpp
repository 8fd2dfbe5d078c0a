#include "parallel/staging_comm.h"

namespace vidit {
namespace {

// Waits for the engine, then copies the staged result into the caller's tensor.
class CopyBackWork : public Work {
 public:
  CopyBackWork(WorkPtr inner, at::Tensor staged, at::Tensor out)
      : inner_(std::move(inner)), staged_(std::move(staged)), out_(std::move(out)) {}
  ~CopyBackWork() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_ = nullptr;
    if (out_.defined()) {
      at::NoGradGuard no_grad;
      out_.copy_(staged_);
    }
    staged_ = out_ = at::Tensor();
  }

 private:
  WorkPtr inner_;
  at::Tensor staged_, out_;
};

}  // namespace

StagingComm::StagingComm(std::shared_ptr<Comm> engine, at::Device device)
    : ForwardingComm(std::move(engine)), device_(device) {}

bool StagingComm::fits(const at::Tensor& t) const {
  // A CUDA device without an index means the current one, which is where the tensors are.
  const bool same_device = t.device().type() == device_.type() && (!device_.has_index() || t.device() == device_);
  return same_device && t.is_contiguous();
}

at::Tensor StagingComm::staged(const at::Tensor& t) const {
  if (fits(t)) return t;
  at::NoGradGuard no_grad;
  return t.detach().to(t.options().device(device_), /*non_blocking=*/false, /*copy=*/true,
                       at::MemoryFormat::Contiguous);
}

at::Tensor StagingComm::staged_output(const at::Tensor& t) const {
  return fits(t) ? t : at::empty(t.sizes(), t.options().device(device_));
}

WorkPtr StagingComm::copy_back(WorkPtr work, at::Tensor staged, at::Tensor out) const {
  if (staged.is_same(out)) return work;
  return std::make_shared<CopyBackWork>(std::move(work), std::move(staged), std::move(out));
}

WorkPtr StagingComm::all_reduce(at::Tensor& t, ReduceOp op) {
  at::Tensor s = staged(t);
  return copy_back(inner_->all_reduce(s, op), s, t);
}

WorkPtr StagingComm::all_gather(const at::Tensor& in, at::Tensor& out) {
  at::Tensor s = staged_output(out);
  return copy_back(inner_->all_gather(staged(in), s), s, out);
}

WorkPtr StagingComm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  at::Tensor s = staged_output(out);
  return copy_back(inner_->reduce_scatter(staged(in), s, op), s, out);
}

WorkPtr StagingComm::all_to_all(const at::Tensor& in, at::Tensor& out) {
  at::Tensor s = staged_output(out);
  return copy_back(inner_->all_to_all(staged(in), s), s, out);
}

WorkPtr StagingComm::broadcast(at::Tensor& t, int root) {
  at::Tensor s = staged(t);
  return copy_back(inner_->broadcast(s, root), s, t);
}

WorkPtr StagingComm::send(const at::Tensor& t, int dst, int tag) {
  at::Tensor s = staged(t);
  WorkPtr w = inner_->send(s, dst, tag);
  // The staged copy must live until the send completes.
  return s.is_same(t) ? w : std::make_shared<CopyBackWork>(std::move(w), s, at::Tensor());
}

WorkPtr StagingComm::recv(at::Tensor& t, int src, int tag) {
  at::Tensor s = staged_output(t);
  return copy_back(inner_->recv(s, src, tag), s, t);
}

std::shared_ptr<Comm> StagingComm::split(int color, int key) {
  return std::make_shared<StagingComm>(inner_->split(color, key), device_);
}

std::shared_ptr<Comm> with_device_rule(std::shared_ptr<Comm> engine, at::Device gpu) {
  if (engine->backend() == "single") return engine;
  const at::Device device = engine->backend() == "nccl" ? gpu : at::Device(at::kCPU);
  return std::make_shared<StagingComm>(std::move(engine), device);
}

}  // namespace vidit
