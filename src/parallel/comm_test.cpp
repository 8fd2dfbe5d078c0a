// The communicator: the single-process identities here; every MPI collective in real processes
// under mpirun (2 and 4 ranks), each against values computed by hand from the ranks.
#include "parallel/comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

TEST(SingleComm, CollectivesAreIdentities) {
  auto c = make_single_comm();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  at::Tensor t = at::arange(6, at::kFloat);
  c->all_reduce(t, ReduceOp::Avg)->wait();
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  at::Tensor out = at::empty_like(t);
  c->all_gather(t, out)->wait();
  EXPECT_TRUE(at::equal(out, t));
  at::Tensor out2 = at::empty_like(t);
  c->all_to_all(t, out2)->wait();
  EXPECT_TRUE(at::equal(out2, t));
  EXPECT_THROW(c->send(t, 1), Error);
  EXPECT_THROW(c->broadcast(t, 1), Error);
  EXPECT_EQ(c->split(3, 0)->size(), 1);
}

TEST(SingleComm, WorldOfOneNeedsNoLauncher) {
  auto c = make_world_comm(LaunchEnv{});
  EXPECT_EQ(c->backend(), "single");
}

// ---- run under mpirun by the driver tests below ----

at::Tensor filled(std::vector<int64_t> shape, double v, at::ScalarType t = at::kFloat) {
  return at::full(shape, v, at::TensorOptions().dtype(t));
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(at::equal(got.to(at::kDouble), want.to(at::kDouble))) << what << "\ngot\n" << got << "\nwant\n" << want;
}

TEST(MpiWorker, Collectives) {
  VIDIT_MPI_WORKER_ONLY();
  auto c = make_world_comm(detect_launch_env());
  const int r = c->rank(), n = c->size();
  // mpirun gives the MPI engine, torchrun gloo (comm_c10d_test.cpp runs this worker there too).
  const char* engine = std::getenv("VIDIT_WANT_ENGINE");
  ASSERT_EQ(c->backend(), engine ? engine : "mpi");
  const double tri = n * (n + 1) / 2.0;  // sum over ranks of (rank + 1)

  for (auto dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    std::string name = std::string(" ") + c10::toString(dt);
    at::Tensor s = filled({5}, r + 1, dt), m = filled({2, 3}, r + 1, dt);
    c->all_reduce(s, ReduceOp::Sum)->wait();
    c->all_reduce(m, ReduceOp::Max)->wait();
    expect_equal(s, filled({5}, tri), "all_reduce sum" + name);
    expect_equal(m, filled({2, 3}, n), "all_reduce max" + name);
    if (dt != at::kLong) {
      at::Tensor a = (at::arange(6, at::kDouble) * (r + 1)).to(dt);
      c->all_reduce(a, ReduceOp::Avg)->wait();
      expect_equal(a, at::arange(6, at::kDouble) * tri / n, "all_reduce avg" + name);
    }
    // all_gather: block j comes from rank j.
    at::Tensor g = at::empty({2 * n, 3}, at::TensorOptions().dtype(dt));
    c->all_gather(filled({2, 3}, r, dt), g)->wait();
    for (int j = 0; j < n; ++j) expect_equal(g.narrow(0, 2 * j, 2), filled({2, 3}, j), "all_gather" + name);
    // reduce_scatter: block j of rank s holds (s + 1) * (j + 1); rank r gets the sum of block r.
    at::Tensor in = at::empty({2 * n, 3}, at::TensorOptions().dtype(dt)), out = filled({2, 3}, -1, dt);
    for (int j = 0; j < n; ++j) in.narrow(0, 2 * j, 2).fill_((r + 1) * (j + 1));
    c->reduce_scatter(in, out, ReduceOp::Sum)->wait();
    expect_equal(out, filled({2, 3}, tri * (r + 1)), "reduce_scatter sum" + name);
    if (dt != at::kLong) {
      c->reduce_scatter(in, out, ReduceOp::Avg)->wait();
      expect_equal(out, filled({2, 3}, tri * (r + 1) / n), "reduce_scatter avg" + name);
    }
    // all_to_all: rank r sends 10 r + j to rank j; receives 10 j + r from rank j.
    at::Tensor send = at::empty({n, 2}, at::TensorOptions().dtype(dt)), recv = at::empty_like(send);
    for (int j = 0; j < n; ++j) send[j].fill_(10 * r + j);
    c->all_to_all(send, recv)->wait();
    for (int j = 0; j < n; ++j) expect_equal(recv[j], filled({2}, 10 * j + r), "all_to_all" + name);
    // broadcast from the last rank.
    at::Tensor b = filled({4}, r, dt);
    c->broadcast(b, n - 1)->wait();
    expect_equal(b, filled({4}, n - 1), "broadcast" + name);
  }

  // Point to point around a ring: post the receive, then the send, then wait for both.
  at::Tensor got = filled({3}, -1), mine = filled({3}, r);
  auto rw = c->recv(got, (r + n - 1) % n, 7);
  auto sw = c->send(mine, (r + 1) % n, 7);
  sw->wait();
  rw->wait();
  expect_equal(got, filled({3}, (r + n - 1) % n), "send/recv ring");

  // Several operations in flight at once, waited in reverse order.
  std::vector<at::Tensor> ts;
  std::vector<WorkPtr> ws;
  for (int k = 0; k < 4; ++k) ts.push_back(filled({1000}, (r + 1) * (k + 1)));
  for (auto& t : ts) ws.push_back(c->all_reduce(t, ReduceOp::Sum));
  for (int k = 3; k >= 0; --k) ws[k]->wait();
  for (int k = 0; k < 4; ++k) expect_equal(ts[k], filled({1000}, tri * (k + 1)), "async all_reduce");

  // Sub-groups: even and odd ranks, ranked in reverse.
  auto sub = c->split(r % 2, -r);
  const int members = (n - r % 2 + 1) / 2;
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->rank(), members - 1 - r / 2);
  at::Tensor x = filled({1}, r, at::kLong);
  sub->all_reduce(x, ReduceOp::Sum)->wait();
  int64_t want = 0;
  for (int j = r % 2; j < n; j += 2) want += j;
  EXPECT_EQ(x.item<int64_t>(), want);

  // Misuse is refused on the caller's side, before any message moves.
  at::Tensor wrong = at::empty({3, 3});
  EXPECT_THROW(c->all_gather(filled({2, 3}, 0), wrong), Error);
  EXPECT_THROW(c->all_reduce(x, ReduceOp::Avg), Error);  // integer average
  c->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, CollectivesOn2Ranks) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.Collectives"), 2);
}

// Rank 1 stops (sleeps) before a collective: rank 0's wait gives up after VIDIT_COMM_TIMEOUT_S
// with an error naming the operation, and ends the job.
TEST(MpiWorker, HungMemberTimesOut) {
  VIDIT_MPI_WORKER_ONLY();
  auto c = make_world_comm(detect_launch_env());
  at::Tensor t = at::ones({4});
  if (c->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  try {
    c->all_reduce(t, ReduceOp::Sum)->wait();
    ADD_FAILURE() << "the all-reduce completed without rank 1";
  } catch (const Error& e) {
    std::printf("rank 0 gave up: %s\n", e.what());
    std::fflush(stdout);
  }
  abort_world(7);
}

TEST(Mpi, HungMemberTimesOut) {
  VIDIT_REQUIRE_MPI();
  auto r = test::mpirun_worker(2, "MpiWorker.HungMemberTimesOut", "VIDIT_COMM_TIMEOUT_S=1.5", 60);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 gave up: MPI Iallreduce in a group of 2 processes did not complete in 1.5 s"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 20) << "the job should end when rank 0 gives up, not when rank 1 wakes";
}

TEST(Mpi, CollectivesOn4Ranks) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.Collectives"), 4);
}

}  // namespace
}  // namespace vidit
