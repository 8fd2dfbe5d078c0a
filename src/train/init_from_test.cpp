// train.init_from under FSDP and tensor parallel, with real ranks under mpirun: every rank copies
// only its part of each tensor out of the memory-mapped release file, and the run starts from
// exactly those weights (gathered back whole, equal to the file's). How much of the file a
// process touched is read from the kernel (the mapping's resident pages): about half under FSDP
// over 2, all of it in one process (so the measure itself is shown to see a whole read).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>

#include "../../tests/test_util.h"
#include "core/mapped_file.h"
#include "loader/dataset.h"
#include "model/dit.h"
#include "model/state_dict.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "train/run_weights.h"
#include "train/trainer.h"

namespace vidit {
namespace {

// Big enough that each tensor spans many pages: 2 blocks of width 256 (about 8 MiB in fp32).
std::vector<std::string> wide_sets(const std::string& release) {
  return {"model.dim=256", "model.ffn_dim=1024", "model.heads=4", "model.text_dim=64", "model.freq_dim=64",
          "train.init_from=\"" + release + "\""};
}

// A release file of random weights (not the seed's init), written once.
TensorMap write_release(const Config& cfg, const std::string& path) {
  torch::manual_seed(77);
  DiT src(cfg.model);
  TensorMap w = state_dict(*src);
  for (auto& [k, v] : w) w[k] = at::randn_like(v);
  save_safetensors(path, w);
  return w;
}

// train.init_from's files mapped with nothing of them in the page cache and no read-ahead, so that
// the pages this process touches are the pages it maps (the kernel otherwise maps whole cached
// folios around each fault).
InitWeights open_cold(const Config& cfg) {
  const int fd = ::open(cfg.train.init_from.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << cfg.train.init_from;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  InitWeights w = open_init_weights(cfg);
  for (const auto& f : w.files) ::madvise(const_cast<uint8_t*>(f->data()), f->size(), MADV_RANDOM);
  return w;
}

TEST(MpiWorker, InitFromReadsOnlyItsPart) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  const std::string release = dir + "/release.safetensors";
  for (const std::string mesh_set : {"parallel.shard=2", "parallel.tensor=2"}) {
    auto sets = wide_sets(release);
    sets.push_back(mesh_set);
    sets.push_back("train.out_dir=" + dir + "/run_" + mesh_set.substr(9, 5));
    const Config cfg = test::tiny_config(sets);
    if (world->rank() == 0 && !std::filesystem::exists(release)) write_release(cfg, release);
    world->barrier();
    const TensorMap file = load_safetensors(release);
    Trainer t(cfg, std::make_shared<SyntheticDataset>(cfg, 8, 1), at::zeros({cfg.model.text_len, cfg.model.text_dim}),
              at::kCPU, std::make_shared<Mesh>(cfg, world));
    for (const auto& [k, v] : t.weights()) EXPECT_TRUE(at::equal(v, file.at(k))) << mesh_set << ": " << k;
    // The same read again, measured, one rank at a time from a cold file: a fresh mapping, this
    // rank's parts copied out of it. (Tensor parallel's row-split weights interleave the ranks'
    // parts within every row, so at page granularity it reads more than its half.)
    for (int r = 0; r < world->size() && cfg.parallel.tensor == 1; ++r) {
      if (world->rank() == r) {
        const InitWeights w = open_cold(cfg);
        load_init_parts(t.parallel_model(), w);
        ASSERT_GT(w.read_bytes(), 0) << "the kernel did not say how much was read";
        EXPECT_LT(double(w.read_bytes()), 0.6 * double(w.file_bytes()))
            << mesh_set << ": rank " << r << " read " << w.read_bytes() << " of " << w.file_bytes();
        std::printf("rank %d (%s): read %lld of %lld bytes\n", r, mesh_set.c_str(), (long long)w.read_bytes(),
                    (long long)w.file_bytes());
      }
      world->barrier();
    }
    world->barrier();
  }
  if (HasFailure()) abort_world(1);
}

TEST(InitFrom, ShardedAndTensorParallelRanksReadTheirParts) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("init_from_parts");
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.InitFromReadsOnlyItsPart", "VIDIT_TEST_DIR=" + dir.path(), 180), 2);
  // One process takes every tensor whole: the measure sees it read (nearly) the whole file.
  const Config cfg = test::tiny_config(wide_sets(dir / "release.safetensors"));
  const InitWeights w = open_cold(cfg);
  DiT model(cfg.model);
  load_state_dict(*model, w.weights, w.from);
  EXPECT_GT(double(w.read_bytes()), 0.95 * double(w.file_bytes())) << w.read_bytes() << " of " << w.file_bytes();
}

}  // namespace
}  // namespace vidit
