// One process started by mpirun (VIDIT_COMM=mpi) or torchrun (VIDIT_COMM=gloo; on a GPU machine
// VIDIT_COMM=nccl with CUDA weights and CPU scalars) trains through an engine of one member, with
// the data-parallel bucket reduction (or, with parallel.apply_all, tensor parallel and FSDP at
// degree 1), and gives the losses and weights of the plain run; with FP8 training and FSDP, the
// e4m3 weight gather gives those of gathering fp32.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

// One process over the engine VIDIT_COMM names, on VIDIT_TEST_DEVICE (cpu or cuda), against the
// plain run in this process.
TEST(MpiWorker, OneProcessOverAnEngineTrainsLikeThePlainRun) {
  VIDIT_MPI_WORKER_ONLY();
  const std::string device_name = std::getenv("VIDIT_TEST_DEVICE") ? std::getenv("VIDIT_TEST_DEVICE") : "cpu";
  const at::Device device = device_name == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  test::ScratchDir dir("one_engine");
  Config cfg = test::tiny_config(test::sets_from_env("VIDIT_TEST_SETS", {"train.steps=6", "train.warmup_steps=2",
                                 "train.batch_size=4", "train.grad_accum=2", "train.out_dir=" + dir.path() + "/engine"}));
  auto world = make_world_comm(detect_launch_env(), device.type());
  ASSERT_EQ(world->size(), 1);
  ASSERT_EQ(world->backend(), std::getenv("VIDIT_COMM"));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 11);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  Trainer engine(cfg, data, null_text, device, std::make_shared<Mesh>(cfg, world));
  if (cfg.parallel.apply_all) {
    ASSERT_NE(engine.parallel_model().find<FullyShardedDataParallel>(), nullptr) << "FSDP runs at degree 1";
    EXPECT_FALSE(engine.parallel_model().layouts().at("blocks.0.ffn.0.weight").cuts.empty());
  } else {
    ASSERT_NE(engine.parallel_model().find<DataParallel>(), nullptr) << "the bucket reduction runs at degree 1";
  }
  std::vector<double> losses = engine.fit(-1, false);
  const CommTimes times = engine.mesh().comm_times();
  EXPECT_GT(times.by_op.at("all_reduce").calls, 0);   // totals, batch shares, buckets, norm
  EXPECT_GT(times.by_op.at("all_gather").calls, 0);   // slowest rank, RNG streams at the save

  // FP8 rounds to a coarse grid, which magnifies the last-bit differences between FSDP at degree
  // 1 and the plain run (the order of their sums): an FP8 run's reference is the same run over
  // the engine with the FP8 weights gathered in fp32, equal to it bit for bit on the CPU.
  const bool fp8_gather = cfg.parallel.apply_all && cfg.parallel.fp8_all_gather &&
                          (cfg.train.precision == Precision::fp8 || cfg.train.precision == Precision::fp8_rowwise);
  if (fp8_gather) EXPECT_GT(engine.parallel_model().find<FullyShardedDataParallel>()->fp8_weights(), 0);
  Config one = cfg;
  if (fp8_gather)
    one.parallel.fp8_all_gather = false;
  else
    one.parallel = ParallelConfig{};
  one.train.out_dir = dir.path() + "/plain";
  Trainer plain(one, data, null_text, device, fp8_gather ? std::make_shared<Mesh>(one, world) : nullptr);
  if (!fp8_gather) EXPECT_EQ(plain.mesh().world()->backend(), "single");
  const std::vector<double> want = plain.fit(-1, false);
  test::expect_losses(losses, want);
  if (fp8_gather && device.is_cpu()) EXPECT_EQ(losses, want);
  TensorMap a = engine.weights(), b = plain.weights();
  for (auto& [k, t] : a) t = t.cpu();
  for (auto& [k, t] : b) t = t.cpu();
  test::expect_params(a, b, cfg.train.lr);
  if (device.is_cpu() && (!cfg.parallel.apply_all || fp8_gather)) {
    // On the CPU the reductions over one member are exact: the runs agree bit for bit.
    for (const auto& [name, t] : b) EXPECT_TRUE(at::equal(a.at(name), t)) << name;
  }
  // Its checkpoint loads in the plain run.
  plain.load(*latest_checkpoint(cfg.train.out_dir));
  EXPECT_EQ(plain.steps_done(), cfg.train.steps);
  std::printf("one process over %s on %s (%s): final loss %.9g (plain %.9g)\n", world->backend().c_str(),
              device_name.c_str(), cfg.parallel.apply_all ? "FSDP and tensor parallel at degree 1" : "data parallel",
              losses.back(), want.back());
}

// FSDP over one member with FP8 training: the projection weights go through the e4m3 gather.
constexpr const char* kFp8OverOneMember = "parallel.apply_all=true train.precision=\"fp8_rowwise\"";

TEST(Mpi, OneProcessOverMpiTrainsLikeThePlainRun) {
  VIDIT_REQUIRE_MPI();
  for (const char* sets : {"", "parallel.apply_all=true", kFp8OverOneMember})
    test::expect_workers_passed(test::mpirun_worker(1, "MpiWorker.OneProcessOverAnEngineTrainsLikeThePlainRun",
                                                    std::string("VIDIT_COMM=mpi VIDIT_TEST_SETS='") + sets + "'"),
                                1);
}

TEST(Torchrun, OneProcessOverGlooTrainsLikeThePlainRun) {
  std::string why;
  if (test::torchrun_launcher(&why, "gloo").empty()) GTEST_SKIP() << why;
  for (const char* sets : {"", "parallel.apply_all=true"})
    test::expect_workers_passed(test::torchrun_worker(1, "MpiWorker.OneProcessOverAnEngineTrainsLikeThePlainRun",
                                                      std::string("VIDIT_COMM=gloo VIDIT_TEST_SETS='") + sets + "'"),
                                1);
}

// GPU machines (bench/gpu/run.sh): the multi-GPU code path on one GPU, NCCL with CUDA weights
// and CPU scalars staged through the GPU.
TEST(Torchrun, OneGpuOverNcclTrainsLikeThePlainRun) {
  std::string why;
  if (test::torchrun_launcher(&why, "nccl").empty()) GTEST_SKIP() << why;
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  for (const char* sets : {"", "parallel.apply_all=true", kFp8OverOneMember})
    test::expect_workers_passed(
        test::torchrun_worker(1, "MpiWorker.OneProcessOverAnEngineTrainsLikeThePlainRun",
                              std::string("VIDIT_COMM=nccl VIDIT_TEST_DEVICE=cuda VIDIT_COMM_TIMEOUT_S=120 VIDIT_TEST_SETS='") +
                                  sets + "'",
                              300, "nccl"),
        1);
}

}  // namespace
}  // namespace vidit
