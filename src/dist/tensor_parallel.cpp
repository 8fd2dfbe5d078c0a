#include "dist/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "core/error.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor summed(Comm& comm, const at::Tensor& x) {
  at::Tensor y = x.contiguous().clone();
  comm.all_reduce(y, ReduceOp::Sum)->wait();
  return y;
}

// Forward and backward each either pass the tensor through or sum it over the group.
template <bool SumForward, bool SumBackward>
class Collective : public torch::autograd::Function<Collective<SumForward, SumBackward>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return SumForward ? summed(comm_at(comm), x) : x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t comm = ctx->saved_data["comm"].toInt();
    return {SumBackward ? summed(comm_at(comm), g[0]) : g[0], at::Tensor()};
  }
};

// Prefixes such as "exp_avg/" in front of a parameter name.
std::string strip_prefix(const std::string& key) {
  const size_t slash = key.find('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

}  // namespace

at::Tensor tp_enter(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : Collective<false, true>::apply(x, comm_address(comm));
}
at::Tensor tp_combine(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : Collective<true, false>::apply(x, comm_address(comm));
}
at::Tensor tp_sum(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : Collective<true, true>::apply(x, comm_address(comm));
}

TensorParallel::TensorParallel(DiTImpl& model, const Mesh& mesh)
    : tp_(mesh.group("tensor")), T_(mesh.degree("tensor")), rank_(mesh.coord("tensor")) {
  for (auto& item : model.named_parameters(true))
    whole_[item.key()] = at::empty(item.value().sizes(), item.value().options().device(at::kMeta));
  std::shared_ptr<Comm> tp = tp_;
  const int64_t T = T_;
  FeatureSplit split;
  split.enter = [tp](const at::Tensor& x) { return tp_enter(x, tp); };
  split.combine = [tp](const at::Tensor& x) { return tp_combine(x, tp); };
  // Mean of squares over the whole vector: this member holds 1/T of its features.
  auto mean_square = [tp, T](const at::Tensor& x) { return tp_sum(x.square().sum(-1, true), tp) / double(x.size(-1) * T); };

  for (size_t i = 0; i < model.blocks->size(); ++i) {
    auto* b = model.blocks[i]->as<DiTBlockImpl>();
    const std::string at = "blocks." + std::to_string(i) + ".";
    for (const char* attn : {"self_attn", "cross_attn"}) {
      for (const char* proj : {"q", "k", "v"}) {
        split_[at + attn + "." + proj + ".weight"] = 0;
        split_[at + attn + "." + proj + ".bias"] = 0;
      }
      split_[at + attn + ".norm_q.weight"] = 0;
      split_[at + attn + ".norm_k.weight"] = 0;
      split_[at + attn + ".o.weight"] = 1;
    }
    split_[at + "ffn.0.weight"] = 0;
    split_[at + "ffn.0.bias"] = 0;
    split_[at + "ffn.2.weight"] = 1;

    VIDIT_CHECK(b->self_attn->heads % T == 0 && b->fc1->weight.size(0) % T == 0,
                "tensor parallel: ", b->self_attn->heads, " heads and ", b->fc1->weight.size(0),
                " MLP units cannot be split over parallel.tensor = ", T, " processes");
    b->self_attn->heads /= T;
    b->cross_attn->heads /= T;
    b->self_attn->split = split;
    b->cross_attn->split = split;
    b->ffn_split = split;
    for (RMSNorm* norm : {&b->self_attn->norm_q, &b->self_attn->norm_k, &b->cross_attn->norm_q, &b->cross_attn->norm_k})
      (*norm)->mean_square = mean_square;
  }

  // Keep this member's rows / columns; the tensors stay the model's (set_data), so modules,
  // optimizers and hooks made later see the parts.
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(true)) {
    auto it = split_.find(item.key());
    if (it == split_.end()) continue;
    at::Tensor& p = item.value();
    const int64_t n = p.size(it->second) / T;
    p.set_data(p.narrow(it->second, rank_ * n, n).clone());
  }
}

int TensorParallel::split_dim(const std::string& name) const {
  auto it = split_.find(name);
  return it == split_.end() ? -1 : it->second;
}

std::string TensorParallel::param_of(const std::string& key) const {
  if (whole_.count(key)) return key;
  const std::string name = strip_prefix(key);
  return whole_.count(name) ? name : std::string();
}

TensorMap TensorParallel::gather_whole(const TensorMap& parts) const {
  at::NoGradGuard no_grad;
  TensorMap out;
  for (const auto& [key, t] : parts) {
    const int dim = split_dim(param_of(key));
    if (dim < 0) {
      out[key] = t;
      continue;
    }
    // The gather concatenates along dim 0: move the split dim there and back.
    at::Tensor in = t.detach().transpose(0, dim).contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] *= T_;
    at::Tensor all = at::empty(shape, in.options());
    tp_->all_gather(in, all)->wait();
    out[key] = all.transpose(0, dim).contiguous();
  }
  return out;
}

TensorMap TensorParallel::part_of(const TensorMap& whole) const {
  TensorMap out;
  for (const auto& [key, t] : whole) {
    const std::string name = param_of(key);
    const int dim = split_dim(name);
    if (dim < 0) {
      out[key] = t;
      continue;
    }
    VIDIT_CHECK(t.sizes() == whole_.at(name).sizes(), "tensor parallel: '", key, "' has shape ", t.sizes(),
                " but the model's parameter ", name, " has ", whole_.at(name).sizes());
    const int64_t n = t.size(dim) / T_;
    out[key] = t.narrow(dim, rank_ * n, n).clone();
  }
  return out;
}

double TensorParallel::global_norm(double sq_replicated, double sq_split) const {
  at::Tensor s = at::tensor({sq_split}, at::kDouble);
  tp_->all_reduce(s, ReduceOp::Sum)->wait();
  return std::sqrt(sq_replicated + s.item<double>());
}

double TensorParallel::clip_grad_norm(const TensorMap& params, double max_norm) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, kind[2];  // kind: replicated, split
  for (const auto& [name, p] : params)
    if (p.grad().defined()) grads.push_back(p.grad()), kind[split_dim(name) >= 0].push_back(p.grad());
  double sq[2] = {0, 0};
  for (int k = 0; k < 2; ++k)
    if (!kind[k].empty()) sq[k] = at::stack(at::_foreach_norm(kind[k], 2)).to(at::kDouble).square().sum().item<double>();
  const double total = global_norm(sq[0], sq[1]);
  if (max_norm > 0 && total > max_norm && !grads.empty()) at::_foreach_mul_(grads, max_norm / (total + 1e-6));
  return total;
}

std::unique_ptr<TensorParallel> apply_tensor_parallel(DiTImpl& model, const Mesh& mesh) {
  if (mesh.degree("tensor") == 1) return nullptr;
  return std::make_unique<TensorParallel>(model, mesh);
}

}  // namespace vidit
