// Sequence parallelism in real processes under mpirun: ring attention, Ulysses and both together
// give full attention's output and gradients on every member's chunk (fp64); and training with
// the tokens split over 2 or 4 ranks, alone or with data parallel, gives the single-process
// losses and parameters (fp32, 1e-5 relative).
#include "parallel/sequence_parallel.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdlib>
#include <sstream>

#include "../../tests/test_util.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/ring_attention.h"
#include "model/state_dict.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

using test::rel_err;

// The attention blocks on their own (one process): merging two key blocks by log-sum-exp and
// summing the blocks' backward gives full attention, on the CPU kernels and the composition.
TEST(RingAttention, BlocksMergeToFullAttention) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::randn({2, 3, 10, 8}, gen, o), k = at::randn({2, 3, 12, 8}, gen, o),
             v = at::randn({2, 3, 12, 8}, gen, o), go = at::randn({2, 3, 10, 8}, gen, o);
  at::Tensor qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
  at::Tensor want = at::scaled_dot_product_attention(qr, kr, vr);
  want.backward(go);
  auto [o1, l1] = attention_block(q, k.narrow(2, 0, 5), v.narrow(2, 0, 5));
  auto [o2, l2] = attention_block(q, k.narrow(2, 5, 7), v.narrow(2, 5, 7));
  at::Tensor lse = at::logaddexp(l1, l2);
  at::Tensor out = o1 * (l1 - lse).exp().unsqueeze(-1) + o2 * (l2 - lse).exp().unsqueeze(-1);
  EXPECT_LT(rel_err(out, want), 1e-12);
  auto [dq1, dk1, dv1] = attention_block_backward(go, q, k.narrow(2, 0, 5), v.narrow(2, 0, 5), out, lse);
  auto [dq2, dk2, dv2] = attention_block_backward(go, q, k.narrow(2, 5, 7), v.narrow(2, 5, 7), out, lse);
  EXPECT_LT(rel_err(dq1 + dq2, qr.grad()), 1e-12);
  EXPECT_LT(rel_err(at::cat({dk1, dk2}, 2), kr.grad()), 1e-12);
  EXPECT_LT(rel_err(at::cat({dv1, dv2}, 2), vr.grad()), 1e-12);
  // The composition used off the CPU agrees with the CPU kernels.
  at::Tensor lse_all = attention_block(q, k, v)[1];
  EXPECT_LT(rel_err(lse_all, lse), 1e-12);
}

// Every rank draws the same global q, k, v [B, L, H, D] and upstream gradient, attends its
// chunk with the mode in VIDIT_SP_MODE (ring | ulysses | both), and compares its output and
// gradients with full attention's.
TEST(MpiWorker, SequenceAttentionMatchesFullAttention) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const int n = world->size(), r = world->rank();
  const std::string mode = std::getenv("VIDIT_SP_MODE") ? std::getenv("VIDIT_SP_MODE") : "";
  const int64_t B = 2, L = 24, H = 4, D = 8, Lc = L / n;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::randn({B, L, H, D}, gen, o), k = at::randn({B, L, H, D}, gen, o),
             v = at::randn({B, L, H, D}, gen, o), go = at::randn({B, L, H * D}, gen, o);
  at::Tensor qf = q.clone().requires_grad_(), kf = k.clone().requires_grad_(), vf = v.clone().requires_grad_();
  at::Tensor want = attention(qf, kf, vf);
  want.backward(go);

  // Ulysses groups: consecutive ranks (u = 2 for "both"); the ring links equal Ulysses coordinates.
  const int u = mode == "ring" ? 1 : mode == "ulysses" ? n : 2;
  auto ulysses = world->split(r / u, r % u), ring = world->split(r % u, r / u);
  AttentionFn inner = attention;
  if (ring->size() > 1)
    inner = [ring](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) { return ring_attention(a, b, c, ring); };
  AttentionFn fn = ulysses->size() > 1 ? ulysses_attention(ulysses, inner) : inner;

  auto mine = [&](const at::Tensor& t) { return t.narrow(1, r * Lc, Lc).contiguous(); };
  at::Tensor ql = mine(q).requires_grad_(), kl = mine(k).requires_grad_(), vl = mine(v).requires_grad_();
  at::Tensor out = fn(ql, kl, vl);
  out.backward(mine(go));
  EXPECT_LT(rel_err(out, mine(want)), 1e-12) << mode;
  EXPECT_LT(rel_err(ql.grad(), mine(qf.grad())), 1e-12) << mode;
  EXPECT_LT(rel_err(kl.grad(), mine(kf.grad())), 1e-12) << mode;
  EXPECT_LT(rel_err(vl.grad(), mine(vf.grad())), 1e-12) << mode;
  world->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, RingAttentionOn4RanksMatchesFullAttention) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.SequenceAttentionMatchesFullAttention",
                                                  "VIDIT_SP_MODE=ring"), 4);
}

TEST(Mpi, UlyssesAttentionOn4RanksMatchesFullAttention) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.SequenceAttentionMatchesFullAttention",
                                                  "VIDIT_SP_MODE=ulysses"), 4);
}

TEST(Mpi, UlyssesInsideRingOn4RanksMatchesFullAttention) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.SequenceAttentionMatchesFullAttention",
                                                  "VIDIT_SP_MODE=both"), 4);
}

// Ten steps of the tiny model with the mesh in VIDIT_SP_SETS: the same losses and parameters as
// one process training the same global batches.
TEST(MpiWorker, SequenceParallelTrainingMatchesOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  ScratchDir dir("sp");
  Config cfg = tiny_config(test::sets_from_env("VIDIT_SP_SETS", {"train.steps=10", "train.batch_size=4",
                                                                 "train.warmup_steps=2", "train.out_dir=" + dir.path()}));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  ASSERT_GT(mesh->degree("sp"), 1);
  Trainer split(cfg, data, null_text, at::kCPU, mesh);
  std::vector<double> losses = split.fit(-1, /*console=*/false);

  for (auto& item : split.model()->named_parameters()) {
    at::Tensor mine = item.value().detach().clone(), lead = mine.clone();
    world->broadcast(lead, 0)->wait();
    EXPECT_LE(rel_err(mine, lead), 1e-7) << item.key() << " differs from rank 0's on rank " << world->rank();
  }
  if (world->rank() == 0) {
    Config one = cfg;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir / "single";
    Trainer single(one, data, null_text);
    std::vector<double> want = single.fit(-1, false);
    test::expect_losses(losses, want);
    test::expect_params(state_dict(*split.model()), state_dict(*single.model()), cfg.train.lr);
    std::printf("sequence parallel (%s): final loss %.9g (one process %.9g)\n", std::getenv("VIDIT_SP_SETS"),
                losses.back(), want.back());
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

// The meshes: ranks and --set items.

class SequenceParallelTraining : public ::testing::TestWithParam<test::WorkerMesh> {};

TEST_P(SequenceParallelTraining, MatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  const test::WorkerMesh& m = GetParam();
  test::run_mesh_worker(m, "MpiWorker.SequenceParallelTrainingMatchesOneProcess", "VIDIT_SP_SETS");
}

// Two micro-batches with the ring: the gradient shares are summed once, after the last.
INSTANTIATE_TEST_SUITE_P(Mpi, SequenceParallelTraining,
                         ::testing::Values(test::WorkerMesh{"Ulysses2", 2, "parallel.ulysses=2"},
                                           test::WorkerMesh{"Ring2Accumulating", 2, "parallel.ring=2 train.grad_accum=2"},
                                           test::WorkerMesh{"Ulysses2xRing2", 4, "parallel.ulysses=2 parallel.ring=2"},
                                           test::WorkerMesh{"Replicate2xUlysses2", 4, "parallel.replicate=2 parallel.ulysses=2"},
                                           test::WorkerMesh{"Replicate2xRing2", 4, "parallel.replicate=2 parallel.ring=2"},
                                           test::WorkerMesh{"Ulysses2xRing2Recomputing1", 4,
                                                            "parallel.ulysses=2 parallel.ring=2 train.recompute_blocks=1"},
                                           test::WorkerMesh{"Ulysses2xRing2RecomputingSelectively", 4,
                                                            "parallel.ulysses=2 parallel.ring=2 train.recompute_blocks=-1 "
                                                            "train.recompute_policy=selective"}),
                         test::mesh_test_name);

}  // namespace
}  // namespace vidit
