#include "parallel/data_parallel.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"
#include "core/unallocated.h"

namespace vidit {
namespace {

// Runs after AccumulateGrad has written a parameter's .grad.
class GradReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::function<void()> f) : f_(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { f_(); }

 private:
  std::function<void()> f_;
};

}  // namespace

DataParallel::DataParallel(std::vector<at::Tensor> params, std::shared_ptr<Comm> dp, int64_t bucket_bytes,
                           double divisor)
    : params_(std::move(params)), dp_(std::move(dp)), divisor_(divisor > 0 ? divisor : dp_->size()),
      bucket_of_(params_.size(), -1) {
  {
    at::NoGradGuard no_grad;
    for (auto& p : params_) {
      VIDIT_CHECK(p.is_leaf() && p.requires_grad() && p.is_contiguous(),
                  "data parallel: parameters must be contiguous leaf tensors that require grad (one of shape ",
                  p.sizes(), " is", p.is_leaf() ? "" : " not a leaf,", p.requires_grad() ? "" : " frozen,",
                  p.is_contiguous() ? "" : " not contiguous", ")");
      // Weights built without storage are initialised alike on every member afterwards
      // (ParallelModel::init_parts, or one file read by all): nothing to send.
      if (!is_unallocated(p)) dp_->broadcast(p, 0)->wait();
    }
  }
  // Reverse registration order: the last layers' gradients are final first.
  std::vector<int64_t> numel;
  for (int i = int(params_.size()) - 1; i >= 0; --i) {
    const at::Tensor& p = params_[i];
    bool fresh = buckets_.empty() || buckets_.back().flat.scalar_type() != p.scalar_type() ||
                 numel.back() * p.element_size() >= bucket_bytes;
    if (fresh) {
      buckets_.push_back(Bucket{{}, {}, at::empty({0}, p.options().requires_grad(false)), 0, nullptr});
      numel.push_back(0);
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(numel.back());
    b.params.push_back(i);
    numel.back() += p.numel();
    bucket_of_[i] = int(buckets_.size()) - 1;
  }
  for (size_t k = 0; k < buckets_.size(); ++k) buckets_[k].flat = at::zeros({numel[k]}, buckets_[k].flat.options());
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i], std::make_unique<GradReadyHook>([this, i] { on_grad_ready(int(i)); }));
}

DataParallel::~DataParallel() {
  for (auto& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
  for (auto& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
}

void DataParallel::begin() {
  for (auto& b : buckets_) b.ready = 0, b.work = nullptr;
  next_launch_ = 0;
  armed_ = true;
}

void DataParallel::on_grad_ready(int param) {
  if (!armed_) return;
  ++buckets_[bucket_of_[param]].ready;
  // Buckets go out in index order on every rank (collectives must match), each once complete.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == int(buckets_[next_launch_].params.size()))
    launch(buckets_[next_launch_++]);
}

void DataParallel::launch(Bucket& b) {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < b.params.size(); ++k) {
    const at::Tensor& g = params_[b.params[k]].grad();
    at::Tensor slot = b.flat.narrow(0, b.offsets[k], params_[b.params[k]].numel());
    if (g.defined())
      slot.copy_(g.reshape(-1));
    else
      slot.zero_();
  }
  b.work = divisor_ == dp_->size() ? dp_->all_reduce(b.flat, ReduceOp::Avg) : dp_->all_reduce(b.flat, ReduceOp::Sum);
}

void DataParallel::finish() {
  VIDIT_CHECK(armed_, "data parallel: finish() without begin() in this step");
  armed_ = false;
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  at::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.work->wait();
    b.work = nullptr;
    if (divisor_ != dp_->size()) b.flat.div_(divisor_);
    for (size_t k = 0; k < b.params.size(); ++k) {
      at::Tensor& p = params_[b.params[k]];
      at::Tensor avg = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(avg);
      else
        p.mutable_grad() = avg.clone();
    }
  }
}

void apply_data_parallel(ParallelModel& pm, const ParallelConfig& cfg) {
  const Mesh& mesh = pm.mesh();
  const char* group = mesh.degree("sp") > 1 ? "dpsp" : "dp";
  const bool engine_of_one = mesh.size() == 1 && mesh.world()->backend() != "single";
  if (mesh.degree(group) == 1 && !engine_of_one) return;
  // Registration order (the model's), so that buckets follow the order backward finishes them;
  // with the model frozen (LoRA), the adapters the run trains, by name.
  std::vector<at::Tensor> ordered;
  for (auto& p : pm.model()->parameters(true))
    if (p.requires_grad()) ordered.push_back(p);
  if (ordered.empty())
    for (const auto& [name, p] : pm.params()) ordered.push_back(p);
  pm.add_sync(std::make_unique<DataParallel>(ordered, mesh.group(group),
                                             std::max<int64_t>(1, int64_t(cfg.bucket_mb * (1 << 20))),
                                             double(mesh.degree("dp"))));
}

}  // namespace vidit
