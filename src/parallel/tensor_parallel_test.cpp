// Tensor parallelism in real processes under mpirun: the split model's output and every
// parameter's gradient equal the whole model's (fp64), and the checkpoint conversion round-trips.
// (Training under tensor parallel is tested in src/train/tensor_parallel_training_test.cpp.)
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "../../tests/test_util.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

using test::rel_err;
using test::tiny_config;

// One forward and backward of the tiny model (4 heads, fp64) whole and split over the world
// (parallel.tensor = world size): the same output on every member, and the gathered gradients
// equal the whole model's, to fp64 rounding. Also an image-to-video model (image features
// projected, image keys and values split by head like the text's, attended beside the text).
TEST(MpiWorker, TensorParallelModelMatchesWholeModel) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const int T = world->size();
  for (const bool image_to_video : {false, true}) {
  SCOPED_TRACE(image_to_video ? "image-to-video" : "text-to-video");
  Config cfg = tiny_config({"model.heads=4", "model.layers=2", "parallel.tensor=" + std::to_string(T),
                            "model.image_dim=" + std::to_string(image_to_video ? 24 : 0),
                            "model.image_pos_tokens=" + std::to_string(image_to_video ? 6 : 0)});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  auto model = [&] {
    torch::manual_seed(5);
    DiT m(cfg.model);
    m->init_weights();
    // Non-zero modulation and head so every path carries signal.
    at::NoGradGuard ng;
    for (auto& p : m->parameters()) p.add_(at::randn(p.sizes()) * 0.05);
    m->to(at::kDouble);
    return m;
  };
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor x = at::randn({2, cfg.model.in_channels, 2, 4, 4}, gen, f64);
  at::Tensor t = at::tensor({300.0, 850.0}, f64);
  at::Tensor text = at::randn({2, cfg.model.text_len, cfg.model.text_dim}, gen, f64);
  at::Tensor up = at::randn({2, cfg.model.out_channels, 2, 4, 4}, gen, f64);
  at::Tensor image = image_to_video ? at::randn({2, 6, 24}, gen, f64) : at::Tensor();

  DiT whole = model();
  at::Tensor want = whole->forward(x, t, text, image);
  (want * up).sum().backward();

  ParallelModel pm(model(), mesh);
  apply_tensor_parallel(pm, cfg.parallel);
  DiT& split = pm.model();
  EXPECT_EQ(split->blocks[0]->as<DiTBlockImpl>()->self_attn->heads, 4 / T);
  EXPECT_EQ(split->blocks[0]->as<DiTBlockImpl>()->fc1->weight.size(0), cfg.model.ffn_dim / T);
  if (image_to_video)
    EXPECT_EQ(split->blocks[0]->as<DiTBlockImpl>()->cross_attn->k_img->weight.size(0), cfg.model.dim / T);
  at::Tensor got = split->forward(x, t, text, image);
  (got * up).sum().backward();
  EXPECT_LT(rel_err(got, want), 1e-12);

  TensorMap grads, want_grads;
  for (auto& item : split->named_parameters()) grads[item.key()] = item.value().grad();
  for (auto& item : whole->named_parameters()) want_grads[item.key()] = item.value().grad();
  TensorMap gathered = pm.whole(grads);
  for (const auto& [name, g] : want_grads) EXPECT_LT(rel_err(gathered.at(name), g), 1e-12) << name;
  // Round trip of the checkpoint conversion.
  TensorMap parts = pm.local(state_dict(*whole));
  for (auto& item : split->named_parameters())
    EXPECT_EQ(rel_err(parts.at(item.key()), item.value().detach()), 0.0) << item.key();
  if (image_to_video) EXPECT_TRUE(want_grads.count("blocks.1.cross_attn.k_img.weight"));
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, TensorParallelModelMatchesWholeModelOn2And4Ranks) {
  VIDIT_REQUIRE_MPI();
  for (int np : {2, 4}) test::expect_workers_passed(test::mpirun_worker(np, "MpiWorker.TensorParallelModelMatchesWholeModel"), np);
}

}  // namespace
}  // namespace vidit
