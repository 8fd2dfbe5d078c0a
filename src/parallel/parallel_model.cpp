#include <cmath>
#include "parallel/parallel_model.h"

#include <algorithm>

#include "core/error.h"
#include "core/unallocated.h"
#include "model/init.h"

namespace vidit {

ParallelModel::ParallelModel(DiT model, std::shared_ptr<const Mesh> mesh, TensorMap trainable)
    : model_(std::move(model)), mesh_(std::move(mesh)), params_(std::move(trainable)) {
  VIDIT_CHECK(mesh_, "ParallelModel needs a mesh (one process: a mesh of size 1)");
  if (params_.empty())
    for (auto& item : model_->named_parameters(true)) params_[item.key()] = item.value();
  layouts_ = replicated_layouts(params_);
}

TensorMap ParallelModel::whole_shapes() const {
  TensorMap out;
  for (const auto& [name, l] : layouts_) {
    const at::Tensor& p = params_.at(name);
    out[name] = at::empty(l.shape, p.options().device(at::kMeta));
  }
  return out;
}

void ParallelModel::add_cut(const std::string& name, const Cut& cut) {
  auto it = layouts_.find(name);
  VIDIT_CHECK(it != layouts_.end(), "layout: no parameter '", name, "'");
  // Checkpoint parts and writers are numbered over the mesh dimensions themselves.
  VIDIT_CHECK(std::find(std::begin(kMeshDims), std::end(kMeshDims), cut.over) != std::end(kMeshDims),
              "layout: '", name, "' is cut over '", cut.over, "', which is not a mesh dimension");
  it->second.cuts.push_back(cut);
}

void ParallelModel::init_parts(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params_) {
    const Layout& l = layouts_.at(name);
    allocate(p);
    fill_initial(p.variable_data(), wan_init_rule(name, l.shape, model_->cfg), seed, name, local_region(l, *mesh_));
  }
}

void ParallelModel::before_backward(bool last) {
  for (auto& s : syncs_) s->before_backward(last);
}

void ParallelModel::after_backward(bool last) {
  for (auto& s : syncs_) s->after_backward(last);
}

void ParallelModel::after_forward_only() {
  for (auto& s : syncs_) s->after_forward_only();
}

double ParallelModel::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  TensorMap grads;
  std::vector<at::Tensor> defined;
  for (const auto& [name, p] : params_) {
    grads[name] = p.grad();
    if (p.grad().defined()) defined.push_back(p.grad());
  }
  // By part of the model (each block; the embeddings, the head), so that a spike's report can
  // name the blocks whose gradients jumped; the same collectives as one global norm.
  part_norms_ = global_norms_by_part(grads, layouts_, *mesh_, model_part);
  double sq = 0;
  for (const auto& [part, norm] : part_norms_) sq += norm * norm;
  const double total = std::sqrt(sq);
  if (max_norm > 0 && total > max_norm && !defined.empty()) at::_foreach_mul_(defined, max_norm / (total + 1e-6));
  return total;
}

TensorMap ParallelModel::whole(const TensorMap& local) const {
  TensorMap out;
  for (const auto& [key, t] : local) {
    const std::string name = state_param(key, layouts_);
    out[key] = name.empty() || layouts_.at(name).cuts.empty() ? t : gather_whole(layouts_.at(name), t, *mesh_);
  }
  return out;
}

at::Tensor ParallelModel::local(const std::string& key, const at::Tensor& whole) const {
  const std::string name = state_param(key, layouts_);
  if (name.empty()) return whole;
  const Layout& l = layouts_.at(name);
  VIDIT_CHECK(whole.sizes().vec() == l.shape, "'", key, "' has shape ", whole.sizes(), " but the parameter ", name,
              " has ", c10::IntArrayRef(l.shape));
  return l.cuts.empty() ? whole : local_part(l, whole, *mesh_);
}

TensorMap ParallelModel::local(const TensorMap& whole) const {
  TensorMap out;
  for (const auto& [key, t] : whole) out[key] = local(key, t);
  return out;
}

bool ParallelModel::writes(const std::string& key) const {
  const std::string name = state_param(key, layouts_);
  for (const char* dim : kMeshDims) {
    const bool cut = !name.empty() && layouts_.at(name).cut_over(dim);
    if (!cut && mesh_->coord(dim) != 0) return false;
  }
  return true;
}

CheckpointPart ParallelModel::part() const {
  CheckpointPart p;
  for (const char* dim : kMeshDims) {
    bool cut = false;
    for (const auto& [name, l] : layouts_) cut = cut || l.cut_over(dim);
    if (!cut) continue;
    p.dims.push_back(dim);
    p.degrees.push_back(mesh_->degree(dim));
    p.index = p.index * mesh_->degree(dim) + mesh_->coord(dim);
  }
  return p;
}

}  // namespace vidit
