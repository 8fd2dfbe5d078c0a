#include "parallel/fsdp.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/error.h"
#include "core/unallocated.h"
#include "core/trace.h"
#include "model/fp8.h"

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

int unit_index(const std::string& name) {
  // "blocks.<i>.<rest>" belongs to block i's unit; everything else to the root.
  if (name.rfind("blocks.", 0) != 0) return 0;
  return 1 + std::stoi(name.substr(7, name.find('.', 7) - 7));
}

int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

}  // namespace

GatherOptions gather_options(const Config& cfg) {
  GatherOptions g;
  g.dtype = cfg.parallel.gather_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat;
  const Precision p = cfg.train.precision;
  g.fp8 = uses_fp8(p) && cfg.parallel.fp8_all_gather;
  g.rowwise = p == Precision::fp8_rowwise;
  g.fast_accum = cfg.train.fp8_fast_accum;
  return g;
}

FullyShardedDataParallel::FullyShardedDataParallel(DiTImpl& model, const Mesh& mesh, const ParallelConfig& cfg,
                                                   GatherOptions gather)
    : model_(&model),
      shard_(mesh.group("shard")),
      replicate_(mesh.group("replicate")),
      sp_(mesh.group("sp")),
      S_(shard_->size()),
      rank_(shard_->rank()),
      reduce_bf16_(cfg.reduce_dtype == Precision::bf16),
      prefetch_(cfg.prefetch),
      gather_(gather) {
  at::NoGradGuard no_grad;
  int without_storage = 0;
  for (auto& item : model.named_parameters(true)) {
    const at::Tensor& p = item.value();
    without_storage += is_unallocated(p);
    VIDIT_CHECK(p.is_contiguous() && p.storage_offset() == 0 &&
                    (is_unallocated(p) || p.storage().nbytes() == size_t(p.nbytes())),
                "FSDP: parameter ", item.key(), " must own its contiguous storage");
    names_.push_back(item.key());
    params_.push_back(p);
  }
  VIDIT_CHECK(without_storage == 0 || without_storage == int(params_.size()), "FSDP: ", without_storage, " of the ",
              params_.size(), " parameters have no memory; a model is either built without storage or with it");
  // A model with weights: every member starts from those of its dpsp group's rank 0 (the members
  // of a tensor group hold different parts). A model built without storage sends nothing: each
  // member's shards are filled afterwards (ParallelModel::init_parts or its part of a file).
  const bool whole_weights = without_storage == 0;
  if (whole_weights)
    for (auto& p : params_) mesh.group("dpsp")->broadcast(p, 0)->wait();

  units_.resize(1 + model.blocks->size());
  unit_of_.resize(params_.size());
  fp8_of_.assign(params_.size(), -1);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int k = unit_index(names_[i]);
    Unit& u = units_[k];
    const at::Tensor& p = params_[i];
    const int64_t n = p.numel(), chunk = (n + S_ - 1) / S_;
    const bool fp8 = gather_.fp8 && p.dim() == 2 && fp8_projection_weight(names_[i]) && fp8_eligible(p.size(1), p.size(0));
    u.params.push_back(int(i));
    u.offset.push_back(u.shard_numel);
    u.chunk.push_back(chunk);
    u.shard_numel += chunk;
    u.wire_offset.push_back(u.wire_bytes);
    u.wire_bytes += round_up4(chunk * (fp8 ? 1 : int64_t(c10::elementSize(gather_.dtype))));
    unit_of_[i] = k;
    at::Tensor shard;
    if (whole_weights) {
      at::Tensor flat = at::constant_pad_nd(p.detach().flatten(), {0, chunk * S_ - n});
      shard = flat.narrow(0, rank_ * chunk, chunk).to(at::kFloat).clone().requires_grad_(true);
    } else {
      shard = at::zeros({chunk}, p.options().dtype(at::kFloat)).requires_grad_(true);
    }
    shard_map_[names_[i]] = shard;
    if (fp8) {
      Fp8Weight f;
      f.param = int(i);
      f.copy = unallocated(p.sizes(), p.options().dtype(at::kFloat8_e4m3fn));
      f.shard = at::zeros({chunk}, shard.options().dtype(at::kByte));
      f.valid = std::clamp<int64_t>(n - rank_ * chunk, 0, chunk);
      f.start = rank_ * chunk;
      fp8_of_[i] = int(fp8_.size());
      fp8_.push_back(std::move(f));
    }
  }
  units_[0].keep = true;  // the root is used before and after the blocks
  for (size_t k = 1; k < units_.size(); ++k) units_[k].keep = !cfg.reshard_after_forward;
  for (auto& p : params_) vidit::release(p);

  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i], std::make_unique<GradReadyHook>([this, i] { on_grad_ready(int(i)); }));

  // The blocks' projections take the gathered e4m3 copy of an FP8 weight in place of the
  // weight; every other call goes on to the function FSDP found.
  if (!fp8_.empty()) {
    std::unordered_map<const c10::TensorImpl*, int> by_weight;
    for (size_t k = 0; k < fp8_.size(); ++k) by_weight[params_[fp8_[k].param].unsafeGetTensorImpl()] = int(k);
    auto wrap = [this, by_weight](LinearFn& fn) {
      inner_linear_fns_.push_back(fn);
      fn = [this, by_weight, inner = fn](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
        const auto it = by_weight.find(w.unsafeGetTensorImpl());
        if (it == by_weight.end()) return inner ? inner(x, w, b) : at::linear(x, w, b);
        const Fp8Weight& f = fp8_[it->second];
        const Fp8Tensor w8{f.copy, f.scale};
        return fp8_linear(x, w, b, gather_.rowwise, gather_.fast_accum, &w8);
      };
    };
    for (const auto& m : *model.blocks) {
      auto& block = *m->as<DiTBlockImpl>();
      wrap(block.self_attn->linear_fn), wrap(block.cross_attn->linear_fn), wrap(block.linear_fn);
    }
  }

  const int blocks = int(units_.size()) - 1;
  model.hooks.model_begin = [this, blocks] {
    quantize_fp8_shards();
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
  // Its hooks point at this object (others' model_end is left as it is).
  model_->hooks.model_begin = nullptr, model_->hooks.block_begin = nullptr, model_->hooks.block_end = nullptr;
  if (!inner_linear_fns_.empty()) {
    size_t next = 0;
    for (const auto& m : *model_->blocks) {
      auto& block = *m->as<DiTBlockImpl>();
      for (LinearFn* fn : {&block.self_attn->linear_fn, &block.cross_attn->linear_fn, &block.linear_fn})
        *fn = inner_linear_fns_[next++];
    }
  }
}

const at::Tensor& FullyShardedDataParallel::gathered(int param) const {
  return fp8_of_[param] >= 0 ? fp8_[fp8_of_[param]].copy : params_[param];
}

void FullyShardedDataParallel::quantize_fp8_shards() {
  if (fp8_.empty()) return;
  at::NoGradGuard no_grad;
  // Each member's largest magnitudes (per weight, or per row), then the weights' own. In the
  // rowwise recipe a chunk covers rows [r0, r0 + k) of the weight, the first and last partly:
  // laid out on whole rows (zeros around it) its row maxima are one amax.
  auto rows_of = [&](const Fp8Weight& f) {
    const int64_t in = params_[f.param].size(1), lead = f.start % in;
    return std::array<int64_t, 3>{f.start / in, f.valid > 0 ? (lead + f.valid + in - 1) / in : 0, lead};
  };
  std::vector<at::Tensor> parts;
  for (const Fp8Weight& f : fp8_) {
    const at::Tensor mine = shard_map_[names_[f.param]].detach().narrow(0, 0, f.valid).abs();
    if (gather_.rowwise) {
      const int64_t in = params_[f.param].size(1);
      const auto [r0, k, lead] = rows_of(f);
      at::Tensor amax = at::zeros({params_[f.param].size(0)}, mine.options());
      if (k > 0) {
        at::Tensor laid = at::zeros({k * in}, mine.options());
        laid.narrow(0, lead, f.valid).copy_(mine);
        amax.narrow(0, r0, k).copy_(laid.view({k, in}).amax(1));
      }
      parts.push_back(amax);
    } else {
      parts.push_back(f.valid > 0 ? mine.amax().reshape({1}) : at::zeros({1}, mine.options()));
    }
  }
  at::Tensor amax = at::cat(parts);
  shard_->all_reduce(amax, ReduceOp::Max)->wait();
  int64_t pos = 0;
  for (Fp8Weight& f : fp8_) {
    const int64_t n = gather_.rowwise ? params_[f.param].size(0) : 1;
    const at::Tensor scale = fp8_scale(amax.narrow(0, pos, n), at::kFloat8_e4m3fn);
    pos += n;
    // The shapes to_fp8 gives: [out, 1] per row, or one element.
    f.scale = gather_.rowwise ? scale.view({n, 1}).contiguous() : scale.reshape({});
    const at::Tensor mine = shard_map_[names_[f.param]].detach().narrow(0, 0, f.valid);
    at::Tensor per_value = f.scale;
    if (gather_.rowwise) {
      const auto [r0, k, lead] = rows_of(f);
      per_value = scale.narrow(0, r0, k).repeat_interleave(params_[f.param].size(1)).narrow(0, lead, f.valid);
    }
    f.shard.narrow(0, 0, f.valid).copy_(fp8_cast(mine, per_value, at::kFloat8_e4m3fn).view(at::kByte));
  }
}

void FullyShardedDataParallel::start_gather(Unit& u) {
  at::NoGradGuard no_grad;
  // This member's chunks as bytes, each at its wire offset: e4m3 or parallel.gather_dtype.
  at::Tensor in = at::zeros({u.wire_bytes}, shard_map_[names_[u.params[0]]].options().dtype(at::kByte));
  for (size_t j = 0; j < u.params.size(); ++j) {
    const int i = u.params[j];
    if (fp8_of_[i] >= 0) {
      in.narrow(0, u.wire_offset[j], u.chunk[j]).copy_(fp8_[fp8_of_[i]].shard);
    } else {
      const int64_t bytes = u.chunk[j] * int64_t(c10::elementSize(gather_.dtype));
      in.narrow(0, u.wire_offset[j], bytes).view(gather_.dtype).copy_(shard_map_[names_[i]].detach());
    }
    allocate(gathered(i));
    gathered_bytes_ += gathered(i).nbytes();
  }
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes_);
  gather_sent_ += u.wire_bytes;
  const at::Tensor words = in.view(at::kInt);  // 4-byte words: MPI counts stay small
  u.gather_buf = at::empty({S_ * u.wire_bytes / 4}, words.options());
  u.gather_work = shard_->all_gather(words, u.gather_buf);
}

void FullyShardedDataParallel::finish_gather(Unit& u) {
  u.gather_work->wait();
  u.gather_work = nullptr;
  at::NoGradGuard no_grad;
  const at::Tensor all = u.gather_buf.view(at::kByte).view({S_, u.wire_bytes});
  for (size_t j = 0; j < u.params.size(); ++j) {
    const int i = u.params[j];
    const int64_t n = params_[i].numel();
    // variable_data(): the same memory under a fresh version counter, so refilling weights that
    // autograd saved in forward does not count as modifying them.
    if (fp8_of_[i] >= 0) {
      const at::Tensor bytes = all.narrow(1, u.wire_offset[j], u.chunk[j]);
      fp8_[fp8_of_[i]].copy.variable_data().view(at::kByte).view(-1).copy_(bytes.reshape(-1).narrow(0, 0, n));
    } else {
      const int64_t width = u.chunk[j] * int64_t(c10::elementSize(gather_.dtype));
      const at::Tensor values = all.narrow(1, u.wire_offset[j], width).view(gather_.dtype);
      params_[i].variable_data().view(-1).copy_(values.reshape(-1).narrow(0, 0, n));
    }
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
    gathered_bytes_ -= gathered(i).nbytes();
    vidit::release(gathered(i));
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
  u.reduce_in = in;
  u.reduce_work = shard_->reduce_scatter(u.reduce_in, u.reduce_out, ReduceOp::Avg);
  u.reducing = true;
  // Two in flight at most: the packed gradients of older units are not kept waiting until the
  // end of backward (every member finishes them in the same order: backward's).
  in_flight_.push_back(int(&u - units_.data()));
  if (in_flight_.size() > 2) {
    finish_reduce(units_[size_t(in_flight_.front())]);
    in_flight_.erase(in_flight_.begin());
  }
  release(u);  // this backward is done with the unit's weights
}

void FullyShardedDataParallel::finish_reduce(Unit& u) {
  at::NoGradGuard no_grad;
  u.reduce_work->wait();
  u.reduce_work = nullptr;
  u.reduce_in = at::Tensor();
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
  u.reduced = true;
}

void FullyShardedDataParallel::after_backward() {
  // Units whose gradients never all arrived (unused parameters) are reduced now, in unit order
  // on every member; then every reduction still in flight is finished, oldest first.
  for (auto& u : units_)
    if (!u.reducing) start_reduce(u);
  for (int k : in_flight_) finish_reduce(units_[size_t(k)]);
  in_flight_.clear();
  for (auto& u : units_) u.ready = 0, u.reducing = false, u.reduced = false;
}

void FullyShardedDataParallel::after_forward_only() {
  for (auto& u : units_)
    if (!u.reducing) release(u);
}

int64_t FullyShardedDataParallel::shard_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, s] : shard_map_) bytes += 2 * s.nbytes();  // weights and gradients
  for (const Fp8Weight& f : fp8_) bytes += f.shard.nbytes();          // and the e4m3 casts
  return bytes;
}

std::vector<Cut> fsdp_cuts(int S) { return {Cut{Cut::Kind::Flat, "shard", 0, S}}; }

void apply_fsdp(ParallelModel& pm, const Config& cfg) {
  const int S = pm.mesh().degree("shard");
  if (S == 1 && !cfg.parallel.apply_all) return;
  auto fsdp = std::make_unique<FullyShardedDataParallel>(*pm.model(), pm.mesh(), cfg.parallel, gather_options(cfg));
  pm.set_params(fsdp->shards());
  for (const auto& [name, shard] : fsdp->shards())
    for (const Cut& c : fsdp_cuts(S)) pm.add_cut(name, c);
  pm.add_sync(std::move(fsdp));
}

}  // namespace vidit
