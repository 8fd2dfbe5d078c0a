// Data parallel in real processes under mpirun: N ranks train the same losses and parameters as
// one process (fp32, 1e-5 relative); `vidit train` runs under mpirun, also with Ulysses and with
// FSDP; a rank that dies mid-step ends the job with an error instead of a hang.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "model/state_dict.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::ScratchDir;
using test::tiny_config;

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// tiny config + extra --set items from VIDIT_DDP_SETS (space separated).
Config worker_config(int world, const std::string& out_dir) {
  std::vector<std::string> sets = {"train.steps=10", "train.batch_size=4", "train.warmup_steps=2",
                                   "train.out_dir=" + out_dir, "parallel.replicate=" + std::to_string(world)};
  if (const char* extra = std::getenv("VIDIT_DDP_SETS")) {
    std::istringstream in(extra);
    for (std::string s; in >> s;) sets.push_back(s);
  }
  return tiny_config(sets);
}

TEST(MpiWorker, DataParallelMatchesOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const int n = world->size();
  ScratchDir dir("ddp");
  Config cfg = worker_config(n, dir.path());
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  Trainer ddp(cfg, data, null_text, at::kCPU, mesh);
  std::vector<double> losses = ddp.fit(-1, /*console=*/false);

  // Every rank holds the same parameters as rank 0.
  for (auto& item : ddp.model()->named_parameters()) {
    at::Tensor mine = item.value().detach().clone(), lead = mine.clone();
    world->broadcast(lead, 0)->wait();
    EXPECT_LE((mine - lead).norm().item<double>(), 1e-7 * lead.norm().item<double>() + 1e-12) << item.key();
  }
  if (world->rank() == 0) {
    // The single-process run of the same global batches, in this process.
    Config one = cfg;
    one.parallel.replicate = 1;
    one.train.out_dir = dir / "single";
    Trainer single(one, data, null_text);
    std::vector<double> want = single.fit(-1, false);
    ASSERT_EQ(losses.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(rel(losses[i], want[i]), 1e-5) << "step " << i + 1 << ": " << losses[i] << " vs " << want[i];
    test::expect_params(state_dict(*ddp.model()), state_dict(*single.model()), cfg.train.lr);
    // Only rank 0 wrote a checkpoint, the final one.
    EXPECT_TRUE(std::filesystem::exists(dir / "metrics.jsonl"));
    std::printf("ddp %d ranks: final loss %.9g (one process %.9g)\n", n, losses.back(), want.back());
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, DataParallelOn2RanksMatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  // Two micro-batches per step: the gradient average happens once, after the last one.
  test::expect_workers_passed(
      test::mpirun_worker(2, "MpiWorker.DataParallelMatchesOneProcess", "VIDIT_DDP_SETS=train.grad_accum=2"), 2);
}

TEST(Mpi, DataParallelOn4RanksMatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  // Small buckets: several all-reduces in flight during backward.
  test::expect_workers_passed(
      test::mpirun_worker(4, "MpiWorker.DataParallelMatchesOneProcess", "VIDIT_DDP_SETS=parallel.bucket_mb=0.01"), 4);
}

// A communicator whose rank `victim` dies at its `at`-th all-reduce (across all its groups):
// std::abort() when VIDIT_FAULT=abort, else exit status 3.
class DiesAtAllReduce : public ForwardingComm {
 public:
  DiesAtAllReduce(std::shared_ptr<Comm> inner, int victim, std::shared_ptr<int> count, int at)
      : ForwardingComm(std::move(inner)), victim_(victim), count_(std::move(count)), at_(at) {}
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    if (++*count_ == at_ && victim_ == world_rank_) {
      const char* how = std::getenv("VIDIT_FAULT");
      std::fprintf(stderr, "injected fault: rank %d exits in the middle of a step\n", world_rank_);
      std::fflush(stderr);
      if (how && std::string(how) == "abort") std::abort();
      std::_Exit(3);
    }
    return ForwardingComm::all_reduce(t, op);
  }
  std::shared_ptr<Comm> split(int color, int key) override {
    auto sub = std::make_shared<DiesAtAllReduce>(inner_->split(color, key), victim_, count_, at_);
    sub->world_rank_ = world_rank_;
    return sub;
  }
  int world_rank_ = 0;

 private:
  int victim_;
  std::shared_ptr<int> count_;
  int at_;
};

TEST(MpiWorker, RankDiesMidStep) {
  VIDIT_MPI_WORKER_ONLY();
  auto inner = make_world_comm(detect_launch_env());
  auto world = std::make_shared<DiesAtAllReduce>(inner, /*victim=*/1, std::make_shared<int>(0), /*at=*/5);
  world->world_rank_ = inner->rank();
  ScratchDir dir("ddp_fault");
  Config cfg = worker_config(inner->size(), dir.path());
  Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 32, 11), at::zeros({cfg.model.text_len, cfg.model.text_dim}),
            at::kCPU, std::make_shared<Mesh>(cfg, world));
  t.fit(-1, false);  // rank 0 waits in a collective that rank 1 never joins
  ADD_FAILURE() << "rank " << inner->rank() << " finished training although rank 1 died";
}

// The job ends with an error naming the dead rank within seconds; the survivor, blocked in the
// gradient all-reduce, never finishes.
void expect_job_ended(const test::ProcessResult& r, const std::string& cause) {
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job hung until timeout killed it:\n" << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("injected fault: rank 1 exits in the middle of a step"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(cause))) << cause << "\n" << r.output;
  EXPECT_EQ(r.output.find("finished training although"), std::string::npos) << r.output;
}

TEST(Mpi, RankThatExitsMidStepEndsTheJob) {
  VIDIT_REQUIRE_MPI();
  expect_job_ended(test::mpirun_worker(2, "MpiWorker.RankDiesMidStep", "", /*limit_s=*/90),
                   "Process name: \\[\\[[0-9]+,[0-9]+\\],1\\]\\s+Exit code:\\s+3");
}

TEST(Mpi, RankThatAbortsMidStepEndsTheJob) {
  VIDIT_REQUIRE_MPI();
  expect_job_ended(test::mpirun_worker(2, "MpiWorker.RankDiesMidStep", "VIDIT_FAULT=abort", /*limit_s=*/90),
                   "process rank 1 .*(signal 6|Aborted)");
}

// `vidit train` under mpirun: the ranks find each other from the launcher's environment, only
// rank 0 prints and writes, and the final loss is the single-process one.
TEST(Mpi, TrainCommandUnderMpirunMatchesOneProcess) {
  VIDIT_REQUIRE_MPI();
  ScratchDir one("train_one"), two("train_two");
  const std::string& sets = test::kTinyTrainArgs;
  auto single = test::run_process(std::string(VIDIT_BINARY) + sets + one.path());
  ASSERT_EQ(single.status, 0) << single.output;
  auto multi = test::mpirun(2, std::string(VIDIT_BINARY) + sets + two.path() + " parallel.replicate=2");
  ASSERT_EQ(multi.status, 0) << multi.output;
  EXPECT_NE(multi.output.find("distributed: 2 processes (openmpi, mpi), data parallel over 2 ("), std::string::npos)
      << multi.output;
  std::smatch a, b;
  std::regex final_loss("done: 4 steps, final loss ([0-9.eE+-]+)");
  ASSERT_TRUE(std::regex_search(single.output, a, final_loss)) << single.output;
  ASSERT_TRUE(std::regex_search(multi.output, b, final_loss)) << multi.output;
  EXPECT_LE(rel(std::stod(b[1]), std::stod(a[1])), 1e-5) << a[1] << " vs " << b[1];
  // The same run with each sample's tokens split over the 2 ranks (Ulysses), and with the
  // parameters sharded over them (FSDP).
  for (auto [set, says] : {std::pair<const char*, const char*>{"parallel.ulysses=2", "tokens split over 2 (ulysses 2 x ring 1)"},
                           {"parallel.shard=2", "(parameters sharded over 2)"}}) {
    ScratchDir out("train_variant");
    auto run = test::mpirun(2, std::string(VIDIT_BINARY) + sets + out.path() + " " + set);
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find(says), std::string::npos) << run.output;
    std::smatch c;
    ASSERT_TRUE(std::regex_search(run.output, c, final_loss)) << run.output;
    EXPECT_LE(rel(std::stod(c[1]), std::stod(a[1])), 1e-5) << set << ": " << a[1] << " vs " << c[1];
  }
  // One console (rank 0): one "done" line and one resolved config.
  EXPECT_EQ(multi.output.find("done: 4 steps", multi.output.find("done: 4 steps") + 1), std::string::npos);
  EXPECT_EQ(multi.output.find("resolved config", multi.output.find("resolved config") + 1), std::string::npos);
}

}  // namespace
}  // namespace vidit
