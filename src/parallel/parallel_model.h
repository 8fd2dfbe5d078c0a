// The model as the trainer sees it after parallelize() (parallelize.h): the single-device DiT,
// transformed in place by each parallelism, plus what those transformations left for the step.
//  - params(): the tensors AdamW and the EMA update, by parameter name: this rank's part of each
//    parameter (the model's own parameters, or FSDP's flat shards of them), fp32 leaves whose
//    .grad holds the fully reduced gradient after the last micro-batch's after_backward();
//  - layouts(): how each of those parts relates to the whole parameter (layout.h);
//  - before_backward() / after_backward() around every micro-batch's backward: the gradient
//    reductions of every technique (data-parallel buckets, FSDP reduce-scatters);
//  - clip_grad_norm(): the global norm over the whole parameters, read from the layouts;
//  - whole() / local(): whole tensors from parts (collective) and parts of whole tensors, for
//    sampling, exporting and loading checkpoints at any mesh;
//  - the checkpoint part this rank writes (writes(), part()).
// In one process the mesh has size 1, every layout is replicated and no technique adds a
// reduction: the same object, the same calls.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/dit.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"

namespace vidit {

// What a parallelism contributes to every step: its gradient reduction, around each
// micro-batch's backward (`last`: the step's last micro-batch, after which every gradient in
// params() must be final).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void before_backward(bool last) {}
  virtual void after_backward(bool last) {}
  // After a forward pass that has no backward (a re-run under no_grad): release what the
  // backward would have released.
  virtual void after_forward_only() {}
};

class ParallelModel {
 public:
  // Every parameter of `model` replicated, no reductions; the transformations edit it.
  // `trainable`, when given, are the parameters the run trains instead of the model's own (LoRA's
  // adapters, model/lora.h: the model's weights are then frozen and no technique touches them).
  ParallelModel(DiT model, std::shared_ptr<const Mesh> mesh, TensorMap trainable = {});

  DiT& model() { return model_; }
  const Mesh& mesh() const { return *mesh_; }
  const std::shared_ptr<const Mesh>& mesh_ptr() const { return mesh_; }
  const TensorMap& params() const { return params_; }
  const Layouts& layouts() const { return layouts_; }
  // Empty tensors (meta device) of every parameter's whole shape: checks and shape decisions.
  TensorMap whole_shapes() const;

  // Build, parallelize, then allocate: gives this rank's part of every parameter memory where it
  // has none (a model built without storage, model/param_storage.h) and Wan's initialisation for
  // `seed` (model/init.h): exactly the values a one-process DiTImpl::init_weights(seed) gives
  // those elements, computed for the part alone. Not collective. The parameters must be the
  // model's own (a LoRA run initialises its base whole before apply_lora instead).
  void init_parts(uint64_t seed);

  void before_backward(bool last);
  void after_backward(bool last);
  // Scales the gradients so the global norm is at most max_norm (0: no clipping); returns the
  // norm before clipping. Collective.
  double clip_grad_norm(double max_norm);
  // The norm of each part's gradient at the last clip_grad_norm ("blocks.3", "head", ...).
  const std::map<std::string, double>& grad_norms_by_part() const { return part_norms_; }
  // A forward pass without backward has ended (see GradientSync).
  void after_forward_only();

  // Whole tensors from this rank's parts; keys are parameter names, possibly behind a prefix
  // ("exp_avg/<name>"), and other keys are copied as they are. Collective over the mesh.
  TensorMap whole(const TensorMap& local) const;
  // This rank's parts of whole tensors (same key rules). Not collective.
  TensorMap local(const TensorMap& whole) const;
  at::Tensor local(const std::string& key, const at::Tensor& whole) const;

  // Checkpoints: whether this rank writes `key` (its part of a parameter, when it is the member
  // with coordinate 0 on every dimension the parameter is not cut over; other keys: rank 0), and
  // the part it writes.
  bool writes(const std::string& key) const;
  CheckpointPart part() const;

  // For the transformations (parallelize.h).
  void add_cut(const std::string& name, const Cut& cut);  // appends to the parameter's layout
  void set_params(TensorMap params) { params_ = std::move(params); }
  void add_sync(std::unique_ptr<GradientSync> sync) { syncs_.push_back(std::move(sync)); }
  // The technique of type T, if it was applied (for tests and reports).
  template <class T>
  const T* find() const {
    for (const auto& s : syncs_)
      if (auto* t = dynamic_cast<const T*>(s.get())) return t;
    return nullptr;
  }

 private:
  DiT model_;
  std::shared_ptr<const Mesh> mesh_;
  TensorMap params_;
  Layouts layouts_;
  std::vector<std::unique_ptr<GradientSync>> syncs_;
  std::map<std::string, double> part_norms_;
};

}  // namespace vidit
