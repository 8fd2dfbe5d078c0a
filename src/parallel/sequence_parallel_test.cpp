// Sequence parallelism: the attention blocks merge to full attention in one process; under
// mpirun, ring attention, Ulysses and both together give full attention's output and gradients
// on every member's chunk (fp64). (Training with the tokens split over ranks is tested in
// src/train/sequence_parallel_training_test.cpp.)
#include "parallel/sequence_parallel.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdlib>
#include <string>

#include "model/layers.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"
#include "parallel/ring_attention.h"

namespace vidit {
namespace {

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

}  // namespace
}  // namespace vidit
