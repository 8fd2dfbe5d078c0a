// Data parallel with batches of different sizes on each rank (what token-budget buckets give):
// every rank's loss is weighted by its share of the samples, so training on 2 ranks whose
// slices of each global batch are 3 + 1 samples, or 4 + 0 (rank 1 idle, computing a stand-in
// with weight 0), gives the losses and weights of one process training on all 4: tested in
// real processes under mpirun, with DDP and with FSDP.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../../tests/test_util.h"
#include "loader/batch_source.h"
#include "../../tests/mpi_test_util.h"
#include "model/state_dict.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using test::expect_losses;
using test::expect_params;
using test::tiny_config;

// Global batches of the next `sizes` total samples of a dataset (in order), of which this rank
// takes `sizes[rank]` rows, starting after the rows of the ranks before it.
class UnevenSlices : public BatchSource {
 public:
  UnevenSlices(std::shared_ptr<const Dataset> data, std::vector<int64_t> sizes, int rank)
      : data_(std::move(data)), sizes_(std::move(sizes)), rank_(rank) {}
  MicroBatch next(int64_t) override {
    int64_t global = 0, offset = 0;
    for (size_t r = 0; r < sizes_.size(); ++r) {
      if (int(r) < rank_) offset += sizes_[r];
      global += sizes_[r];
    }
    std::vector<int64_t> all;
    for (int64_t i = 0; i < global; ++i) all.push_back((position_ + i) % data_->size());
    position_ += global;
    auto [x, t] = data_->batch(all);  // the global batch; this rank keeps its rows
    const int64_t mine = sizes_[size_t(rank_)];
    return {x.narrow(0, offset, mine).clone(), at::Tensor(), t.narrow(0, offset, mine).clone(), global, offset, {}};
  }
  SamplerState state() const override { return {0, 0, position_}; }
  void set_state(const SamplerState& s) override { position_ = s.position; }
  bool slices_global_batch() const override { return true; }

 private:
  std::shared_ptr<const Dataset> data_;
  std::vector<int64_t> sizes_;
  int rank_;
  int64_t position_ = 0;
};

// VIDIT_SPLIT ("3,1" or "4,0") and VIDIT_SHARE_SETS (the mesh) from the driver.
TEST(MpiWorker, UnevenBatchesTrainLikeOneProcess) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  const std::string split = std::getenv("VIDIT_SPLIT");
  const std::vector<int64_t> sizes = {std::stoll(split.substr(0, split.find(','))),
                                      std::stoll(split.substr(split.find(',') + 1))};
  Config cfg = tiny_config(test::sets_from_env("VIDIT_SHARE_SETS", {"train.steps=6", "train.warmup_steps=2",
                                                                     "train.out_dir=" + dir + "/dp"}));
  auto data = std::make_shared<SyntheticDataset>(cfg, 32, 5);
  auto null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  auto mesh = std::make_shared<Mesh>(cfg, world);
  ASSERT_EQ(mesh->degree("dp"), 2);
  Trainer dp(cfg, std::make_shared<UnevenSlices>(data, sizes, mesh->coord("dp")), null_text, at::kCPU, mesh);
  std::vector<double> losses = dp.fit(-1, /*console=*/false);
  world->barrier();
  if (world->rank() == 0) {
    Config one = cfg;
    one.parallel = ParallelConfig{};
    one.train.out_dir = dir + "/single";
    Trainer single(one, std::make_shared<UnevenSlices>(data, std::vector<int64_t>{sizes[0] + sizes[1]}, 0), null_text);
    expect_losses(losses, single.fit(-1, false));
    expect_params(load_checkpoint(*latest_checkpoint(dir + "/dp")).model, state_dict(*single.model()), cfg.train.lr);
  }
  world->barrier();
  if (HasFailure()) abort_world(1);
}

struct ShareCase {
  const char* split;
  const char* sets;
};

class UnevenBatches : public ::testing::TestWithParam<ShareCase> {};

TEST_P(UnevenBatches, TrainLikeOneProcess) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("uneven");
  const ShareCase& c = GetParam();
  test::expect_workers_passed(
      test::mpirun_worker(2, "MpiWorker.UnevenBatchesTrainLikeOneProcess",
                          "VIDIT_TEST_DIR=" + dir.path() + " VIDIT_SPLIT=" + c.split + " VIDIT_SHARE_SETS=" + c.sets),
      2);
}

INSTANTIATE_TEST_SUITE_P(Mpi, UnevenBatches,
                         ::testing::Values(ShareCase{"3,1", "parallel.replicate=2"},
                                           ShareCase{"4,0", "parallel.replicate=2"},
                                           ShareCase{"1,3", "parallel.shard=2"},
                                           ShareCase{"0,4", "parallel.shard=2"}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.sets).find("shard") != std::string::npos
                                                  ? "Fsdp"
                                                  : "Ddp";
                           return name + "_" + std::string(1, info.param.split[0]) + "_" +
                                  std::string(1, info.param.split[2]);
                         });

}  // namespace
}  // namespace vidit
