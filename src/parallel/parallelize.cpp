#include "parallel/parallelize.h"

#include "parallel/data_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/plan.h"
#include "parallel/sequence_parallel.h"
#include "parallel/tensor_parallel.h"

namespace vidit {

std::unique_ptr<ParallelModel> parallelize(DiT model, std::shared_ptr<const Mesh> mesh, const Config& cfg,
                                           const BlockActivations* activations, TensorMap trainable) {
  auto pm = std::make_unique<ParallelModel>(std::move(model), std::move(mesh), std::move(trainable));
  apply_tensor_parallel(*pm, cfg.parallel);
  apply_sequence_parallel(*pm);
  const RecomputeCounts rc = recompute_counts(cfg, activations);
  pm->model()->recompute_blocks = rc.whole;
  pm->model()->selective_blocks = rc.selective;
  if (cfg.parallel.shard > 1 || cfg.parallel.apply_all)
    apply_fsdp(*pm, cfg);
  else
    apply_data_parallel(*pm, cfg.parallel);
  return pm;
}

Layouts planned_layouts(const TensorMap& whole, const ParallelConfig& p) {
  Layouts out = replicated_layouts(whole);
  for (auto& [name, l] : out) {
    if (p.tensor > 1 || p.apply_all)
      for (const Cut& c : tensor_parallel_cuts(name, int(p.tensor))) l.cuts.push_back(c);
    if (p.shard > 1 || p.apply_all)
      for (const Cut& c : fsdp_cuts(int(p.shard))) l.cuts.push_back(c);
  }
  return out;
}

}  // namespace vidit
