#include "parallel/fsdp.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"
#include "core/trace.h"

namespace vidit {
namespace {

// Runs after AccumulateGrad has written a parameter's .grad.
class GradReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit GradReadyHook(std::function<void()> f) : f_(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { f_(); }

 private:
  std::function<void()> f_;
};

// A parameter's memory is released and refilled in place: its tensor (held by autograd for
// backward) keeps its storage object, whose bytes come and go.
void free_storage(const at::Tensor& p) {
  c10::StorageImpl* s = p.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
  s->set_nbytes(0);
}

void alloc_storage(const at::Tensor& p) {
  c10::StorageImpl* s = p.storage().unsafeGetStorageImpl();
  const size_t bytes = size_t(p.numel()) * p.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

int unit_index(const std::string& name) {
  // "blocks.<i>.<rest>" belongs to block i's unit; everything else to the root.
  if (name.rfind("blocks.", 0) != 0) return 0;
  return 1 + std::stoi(name.substr(7, name.find('.', 7) - 7));
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(DiTImpl& model, const Mesh& mesh, const ParallelConfig& cfg)
    : model_(&model),
      shard_(mesh.group("shard")),
      replicate_(mesh.group("replicate")),
      sp_(mesh.group("sp")),
      S_(shard_->size()),
      rank_(shard_->rank()),
      reduce_bf16_(cfg.reduce_dtype == Precision::bf16),
      prefetch_(cfg.prefetch) {
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(true)) {
    VIDIT_CHECK(item.value().is_contiguous() && item.value().storage_offset() == 0 &&
                    item.value().storage().nbytes() == size_t(item.value().nbytes()),
                "FSDP: parameter ", item.key(), " must own its contiguous storage");
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  // Every member starts from the weights of its dpsp group's rank 0 (the members of a tensor
  // group hold different parts).
  for (auto& p : params_) mesh.group("dpsp")->broadcast(p, 0)->wait();

  units_.resize(1 + model.blocks->size());
  unit_of_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const int k = unit_index(names_[i]);
    Unit& u = units_[k];
    const int64_t n = params_[i].numel(), chunk = (n + S_ - 1) / S_;
    u.params.push_back(int(i));
    u.offset.push_back(u.shard_numel);
    u.chunk.push_back(chunk);
    u.shard_numel += chunk;
    unit_of_[i] = k;
    at::Tensor flat = at::constant_pad_nd(params_[i].detach().flatten(), {0, chunk * S_ - n});
    at::Tensor shard = flat.narrow(0, rank_ * chunk, chunk).to(at::kFloat).clone().requires_grad_(true);
    shard_map_[names_[i]] = shard;
  }
  units_[0].keep = true;  // the root is used before and after the blocks
  for (size_t k = 1; k < units_.size(); ++k) units_[k].keep = !cfg.reshard_after_forward;
  for (auto& p : params_) free_storage(p);

  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i], std::make_unique<GradReadyHook>([this, i] { on_grad_ready(int(i)); }));

  const int blocks = int(units_.size()) - 1;
  model.hooks.model_begin = [this, blocks] {
    ensure_gathered(0);
    if (blocks > 0) prefetch(1);
  };
  model.hooks.block_begin = [this, blocks](int64_t i) {
    if (trace::on()) forward_start_us_ = trace::now_us();
    ensure_gathered(int(1 + i));
    if (i + 1 < blocks) prefetch(int(2 + i));
  };
  model.hooks.block_end = [this](int64_t i, const at::Tensor& out) {
    if (trace::on() && forward_start_us_ >= 0)
      trace::slice("block " + std::to_string(i) + " forward", "fsdp", forward_start_us_, trace::now_us() - forward_start_us_);
    Unit& u = units_[1 + i];
    if (!u.keep) release(u);
    if (out.requires_grad())
      // Backward reaches this block when its output's gradient is ready: gather it again and
      // prefetch the block before it.
      out.register_hook([this, i](const at::Tensor&) {
        end_backward_slice();
        if (trace::on()) backward_block_ = int(i), backward_start_us_ = trace::now_us();
        ensure_gathered(int(1 + i));
        if (i > 0) prefetch(int(i));
      });
    return out;
  };
}

void FullyShardedDataParallel::prefetch(int k) {
  if (prefetch_ && !units_[k].gathered && !units_[k].gather_work) start_gather(units_[k]);
}

void FullyShardedDataParallel::end_backward_slice() {
  if (backward_block_ < 0) return;
  trace::slice("block " + std::to_string(backward_block_) + " backward", "fsdp", backward_start_us_,
               trace::now_us() - backward_start_us_);
  backward_block_ = -1;
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& u : units_) {
    try {
      if (u.gather_work) u.gather_work->wait();
      if (u.reduce_work) u.reduce_work->wait();
    } catch (...) {
    }
  }
  for (auto& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
  model_->hooks = ForwardHooks{};  // they point at this object
}

void FullyShardedDataParallel::start_gather(Unit& u) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> mine;
  for (int i : u.params) {
    mine.push_back(shard_map_[names_[i]].detach());
    alloc_storage(params_[i]);
    gathered_bytes_ += params_[i].nbytes();
  }
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes_);
  at::Tensor in = at::cat(mine);
  u.gather_buf = at::empty({S_ * u.shard_numel}, in.options());
  u.gather_work = shard_->all_gather(in, u.gather_buf);
}

void FullyShardedDataParallel::finish_gather(Unit& u) {
  u.gather_work->wait();
  u.gather_work = nullptr;
  at::NoGradGuard no_grad;
  at::Tensor all = u.gather_buf.view({S_, u.shard_numel});
  for (size_t j = 0; j < u.params.size(); ++j) {
    at::Tensor& p = params_[u.params[j]];
    // variable_data(): the same memory under a fresh version counter, so refilling weights that
    // autograd saved in forward does not count as modifying them.
    p.variable_data().view(-1).copy_(all.narrow(1, u.offset[j], u.chunk[j]).reshape(-1).narrow(0, 0, p.numel()));
  }
  u.gather_buf = at::Tensor();
  u.gathered = true;
}

void FullyShardedDataParallel::ensure_gathered(int k) {
  Unit& u = units_[k];
  if (u.gathered) return;
  if (!u.gather_work) start_gather(u);
  finish_gather(u);
}

void FullyShardedDataParallel::release(Unit& u) {
  if (u.gather_work) finish_gather(u);
  if (!u.gathered) return;
  for (int i : u.params) {
    free_storage(params_[i]);
    gathered_bytes_ -= params_[i].nbytes();
  }
  u.gathered = false;
}

void FullyShardedDataParallel::on_grad_ready(int param) {
  Unit& u = units_[unit_of_[param]];
  if (++u.ready == int(u.params.size())) start_reduce(u);
}

void FullyShardedDataParallel::start_reduce(Unit& u) {
  at::NoGradGuard no_grad;
  // Row s of `in` is member s's part: each parameter's chunk s, in the unit's shard layout.
  at::Tensor in = at::zeros({S_, u.shard_numel}, params_[u.params[0]].options().dtype(at::kFloat));
  for (size_t j = 0; j < u.params.size(); ++j) {
    at::Tensor& p = params_[u.params[j]];
    if (!p.grad().defined()) continue;
    at::Tensor g = at::constant_pad_nd(p.grad().flatten().to(at::kFloat), {0, u.chunk[j] * S_ - p.numel()});
    in.narrow(1, u.offset[j], u.chunk[j]).copy_(g.view({S_, u.chunk[j]}));
    p.mutable_grad() = at::Tensor();
  }
  if (reduce_bf16_) in = in.to(at::kBFloat16);
  // The block's backward ends with its last gradient (a slice in the trace).
  if (&u - units_.data() == backward_block_ + 1) end_backward_slice();
  in = in.view(-1);
  u.reduce_out = at::empty({u.shard_numel}, in.options());
  u.reduce_work = shard_->reduce_scatter(in, u.reduce_out, ReduceOp::Avg);
  u.reducing = true;
  release(u);  // this backward is done with the unit's weights
}

void FullyShardedDataParallel::after_backward() {
  // Units whose gradients never all arrived (unused parameters) are reduced now, in unit order
  // on every member.
  for (auto& u : units_)
    if (!u.reducing) start_reduce(u);
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    u.reduce_work->wait();
    u.reduce_work = nullptr;
    at::Tensor r = u.reduce_out.to(at::kFloat);
    if (sp_->size() > 1) sp_->all_reduce(r, ReduceOp::Sum)->wait();  // shares of one sample's gradient
    if (replicate_->size() > 1) replicate_->all_reduce(r, ReduceOp::Avg)->wait();  // HSDP
    for (size_t j = 0; j < u.params.size(); ++j) {
      at::Tensor& shard = shard_map_[names_[u.params[j]]];
      at::Tensor part = r.narrow(0, u.offset[j], u.chunk[j]);
      if (shard.grad().defined())
        shard.mutable_grad().add_(part);
      else
        shard.mutable_grad() = part.clone();
    }
    u.reduce_out = at::Tensor();
    u.ready = 0;
    u.reducing = false;
  }
}

void FullyShardedDataParallel::after_forward_only() {
  for (auto& u : units_)
    if (!u.reducing) release(u);
}

int64_t FullyShardedDataParallel::shard_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, s] : shard_map_) bytes += 2 * s.nbytes();  // weights and gradients
  return bytes;
}

std::vector<Cut> fsdp_cuts(int S) { return {Cut{Cut::Kind::Flat, "shard", 0, S}}; }

void apply_fsdp(ParallelModel& pm, const ParallelConfig& cfg) {
  const int S = pm.mesh().degree("shard");
  if (S == 1 && !cfg.apply_all) return;
  auto fsdp = std::make_unique<FullyShardedDataParallel>(*pm.model(), pm.mesh(), cfg);
  pm.set_params(fsdp->shards());
  for (const auto& [name, shard] : fsdp->shards())
    for (const Cut& c : fsdp_cuts(S)) pm.add_cut(name, c);
  pm.add_sync(std::move(fsdp));
}

}  // namespace vidit
