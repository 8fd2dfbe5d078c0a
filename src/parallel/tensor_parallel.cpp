#include "parallel/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "core/error.h"
#include "core/unallocated.h"

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

std::vector<Cut> tensor_parallel_cuts(const std::string& name, int T) {
  if (name.rfind("blocks.", 0) != 0) return {};
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return {};
  const std::string rest = name.substr(dot + 1);
  auto cut = [&](int dim) { return std::vector<Cut>{Cut{Cut::Kind::Split, "tensor", dim, T}}; };
  for (const char* attn : {"self_attn.", "cross_attn."}) {
    if (rest.rfind(attn, 0) != 0) continue;
    const std::string leaf = rest.substr(std::string(attn).size());
    for (const char* proj : {"q", "k", "v", "k_img", "v_img"})
      if (leaf == std::string(proj) + ".weight" || leaf == std::string(proj) + ".bias") return cut(0);
    if (leaf == "norm_q.weight" || leaf == "norm_k.weight" || leaf == "norm_k_img.weight") return cut(0);
    if (leaf == "o.weight") return cut(1);
    return {};
  }
  if (rest == "ffn.0.weight" || rest == "ffn.0.bias") return cut(0);
  if (rest == "ffn.2.weight") return cut(1);
  return {};
}

void apply_tensor_parallel(ParallelModel& pm, const ParallelConfig& cfg) {
  const Mesh& mesh = pm.mesh();
  const int T = mesh.degree("tensor"), rank = mesh.coord("tensor");
  if (T == 1 && !cfg.apply_all) return;
  DiTImpl& model = *pm.model();
  std::shared_ptr<Comm> tp = mesh.group("tensor");
  FeatureSplit split;
  split.enter = [tp](const at::Tensor& x) { return tp_enter(x, tp); };
  split.combine = [tp](const at::Tensor& x) { return tp_combine(x, tp); };
  // Mean of squares over the whole vector: this member holds 1/T of its features.
  auto mean_square = [tp, T](const at::Tensor& x) { return tp_sum(x.square().sum(-1, true), tp) / double(x.size(-1) * T); };

  for (size_t i = 0; i < model.blocks->size(); ++i) {
    auto* b = model.blocks[i]->as<DiTBlockImpl>();
    VIDIT_CHECK(b->self_attn->heads % T == 0 && b->fc1->weight.size(0) % T == 0,
                "tensor parallel: ", b->self_attn->heads, " heads and ", b->fc1->weight.size(0),
                " MLP units cannot be split over parallel.tensor = ", T, " processes");
    b->self_attn->heads /= T;
    b->cross_attn->heads /= T;
    b->self_attn->split = split;
    b->cross_attn->split = split;
    b->ffn_split = split;
    for (RMSNorm* norm : {&b->self_attn->norm_q, &b->self_attn->norm_k, &b->cross_attn->norm_q, &b->cross_attn->norm_k,
                          &b->cross_attn->norm_k_img})
      if (*norm) (*norm)->mean_square = mean_square;
  }

  // Keep this member's rows / columns; the tensors stay the model's (set_data), so modules,
  // optimizers and hooks made later see the parts. A model built without storage gets parts
  // without storage.
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : pm.params()) {
    for (const Cut& c : tensor_parallel_cuts(name, T)) {
      const int64_t n = p.size(c.dim) / T;
      if (is_unallocated(p)) {  // built without storage: the part's shape only (init_parts fills it)
        std::vector<int64_t> shape = p.sizes().vec();
        shape[size_t(c.dim)] = n;
        at::Tensor(p).set_data(unallocated(shape, p.options()));
      } else {
        at::Tensor(p).set_data(p.narrow(c.dim, rank * n, n).clone());
      }
      pm.add_cut(name, c);
    }
  }
}

}  // namespace vidit
