// The device rule of the collectives (staging_comm.h), under a real launcher: 2 MPI ranks hand
// the world communicator tensors the engine cannot take as they are (non-contiguous views:
// transposes, column slices) to every collective; results land in the caller's tensors, views of
// their storage included. (One process training over a real engine is tested in
// src/train/engine_training_test.cpp.)
#include "parallel/staging_comm.h"

#include <gtest/gtest.h>

#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

TEST(MpiWorker, CollectivesTakeNonContiguousTensors) {
  VIDIT_MPI_WORKER_ONLY();
  auto c = make_world_comm(detect_launch_env());
  const int r = c->rank(), n = c->size();
  ASSERT_EQ(n, 2);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // all_reduce in place through a transposed view: the base tensor sees the sum.
  at::Tensor base = at::arange(6, f64).view({2, 3}) * (r + 1);
  at::Tensor view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  c->all_reduce(view, ReduceOp::Sum)->wait();
  EXPECT_TRUE(at::equal(base, at::arange(6, f64).view({2, 3}) * 3));
  // all_gather from a column slice into a transposed output.
  at::Tensor src = at::arange(12, f64).view({3, 4}) + 100 * r;
  at::Tensor in = src.narrow(1, 1, 2);  // [3, 2], strided
  at::Tensor out_base = at::zeros({2, 6}, f64), out = out_base.t();  // [6, 2], strided
  c->all_gather(in, out)->wait();
  at::Tensor want = at::cat({(at::arange(12, f64).view({3, 4})).narrow(1, 1, 2),
                             (at::arange(12, f64).view({3, 4}) + 100).narrow(1, 1, 2)});
  EXPECT_TRUE(at::equal(out_base.t(), want));
  // reduce_scatter and all_to_all into strided outputs.
  at::Tensor rs_in = at::ones({4, 2}, f64).t().contiguous().t() * (r + 1);  // [4, 2] column-major
  at::Tensor rs_base = at::zeros({2, 2}, f64), rs_out = rs_base.t();
  c->reduce_scatter(rs_in, rs_out, ReduceOp::Sum)->wait();
  EXPECT_TRUE(at::equal(rs_base, at::full({2, 2}, 3.0, f64)));
  at::Tensor a2a_in = (at::arange(4, f64) + 10 * r).view({4, 1});
  at::Tensor a2a_base = at::zeros({1, 4}, f64), a2a_out = a2a_base.t();
  c->all_to_all(a2a_in, a2a_out)->wait();
  // Block j of the output came from member j: rows 2j, 2j + 1 of its input's block r.
  EXPECT_TRUE(at::equal(a2a_base.flatten(), at::tensor({2.0 * r, 2.0 * r + 1, 10 + 2.0 * r, 11 + 2.0 * r}, f64)));
  // broadcast into a column slice; send / recv of strided tensors.
  at::Tensor b_base = at::zeros({3, 3}, f64);
  at::Tensor b = b_base.narrow(1, 1, 1);
  if (r == 0) b.fill_(7);
  c->broadcast(b, 0)->wait();
  EXPECT_EQ(b_base.sum().item<double>(), 21.0);
  EXPECT_EQ(b_base.narrow(1, 0, 1).abs().sum().item<double>(), 0.0);
  at::Tensor p_base = at::zeros({2, 4}, f64), p = p_base.narrow(1, 2, 2);
  if (r == 0) {
    p.copy_(at::full({2, 2}, 5.0, f64));
    c->send(p, 1, 3)->wait();
  } else {
    c->recv(p, 0, 3)->wait();
    EXPECT_TRUE(at::equal(p_base, at::cat({at::zeros({2, 2}, f64), at::full({2, 2}, 5.0, f64)}, 1)));
  }
  c->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, CollectivesTakeNonContiguousTensors) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.CollectivesTakeNonContiguousTensors"), 2);
}

}  // namespace
}  // namespace vidit
