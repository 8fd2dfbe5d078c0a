// One process is a mesh of size 1: a run's every layout replicated, no data-parallel gradient
// reduction, one part, and the global norm of a step's gradients (parallel/layout.h) the plain one.
#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "parallel/data_parallel.h"
#include "parallel/layout.h"
#include "parallel/parallel_model.h"
#include "train/trainer.h"

namespace vidit {
namespace {

// One process is a mesh of size 1: every layout replicated, no gradient reduction, and the
// global norm is the plain one.
TEST(ParallelModel, OneProcessIsAMeshOfOne) {
  Config cfg = test::tiny_config({"train.steps=2"});
  Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 8, 3), at::zeros({cfg.model.text_len, cfg.model.text_dim}));
  EXPECT_EQ(t.mesh().size(), 1);
  EXPECT_EQ(t.mesh().world()->backend(), "single");
  const ParallelModel& pm = t.parallel_model();
  EXPECT_EQ(pm.find<DataParallel>(), nullptr);
  for (const auto& [name, l] : pm.layouts()) EXPECT_TRUE(l.cuts.empty()) << name;
  EXPECT_EQ(pm.part().count(), 1);
  t.step();
  // The step's norm is the norm of every gradient (before clipping, here after: at most 1).
  std::vector<at::Tensor> grads;
  TensorMap by_name;
  for (const auto& [name, p] : pm.params()) grads.push_back(p.grad()), by_name[name] = p.grad();
  const double plain = at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).norm().item<double>();
  EXPECT_NEAR(global_norm(by_name, pm.layouts(), t.mesh()), plain, 1e-9 * plain);
}

}  // namespace
}  // namespace vidit
