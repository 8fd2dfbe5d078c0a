// The device mesh: refusals of meshes that cannot train a config (naming the keys), rank
// coordinates, and the named sub-groups in real processes under mpirun.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

using test::tiny_config;

std::string refusal(const Config& c, int world) {
  try {
    validate_mesh(c, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Mesh, ParallelSectionParsesAndRoundTrips) {
  Config c = tiny_config({"parallel.replicate=2", "parallel.ring=2"});
  EXPECT_EQ(c.parallel.replicate, 2);
  EXPECT_EQ(c.parallel.ring, 2);
  EXPECT_EQ(parse_config(config_to_toml(c), "x").parallel.ring, 2);
  EXPECT_THROW(tiny_config({"parallel.rings=2"}), Error);
  EXPECT_THROW(tiny_config({"parallel.tensor=0"}), Error);
}

TEST(Mesh, RefusesAProductThatIsNotTheWorldAndSaysWhatToSet) {
  std::string e = refusal(tiny_config({"parallel.tensor=2", "train.batch_size=4"}), 8);
  EXPECT_NE(e.find("parallel.replicate x parallel.shard x parallel.tensor x parallel.ulysses x parallel.ring = "
                   "1 x 1 x 2 x 1 x 1 = 2, but the job has 8 processes"),
            std::string::npos) << e;
  EXPECT_NE(e.find("set parallel.replicate = 4"), std::string::npos) << e;
  std::string odd = refusal(tiny_config({"parallel.tensor=2"}), 3);
  EXPECT_NE(odd.find("choose degrees whose product is 3 (or launch 2 processes)"), std::string::npos) << odd;
  EXPECT_EQ(refusal(tiny_config({"parallel.replicate=2", "parallel.tensor=2"}), 4), "");
}

TEST(Mesh, RefusesHeadsTokensAndWidthsThatDoNotSplit) {
  // tiny: 2 heads, dim 32, ffn 64, latents 2x4x4 with patch 1x2x2 = 8 tokens.
  std::string heads = refusal(tiny_config({"parallel.tensor=2", "parallel.ulysses=2"}), 4);
  EXPECT_NE(heads.find("model.heads (2) must be divisible by parallel.tensor x parallel.ulysses = 2 x 2 = 4"),
            std::string::npos) << heads;
  std::string tokens = refusal(tiny_config({"parallel.ring=16"}), 16);
  EXPECT_NE(tokens.find("8 tokens"), std::string::npos) << tokens;
  EXPECT_NE(tokens.find("parallel.ulysses x parallel.ring = 1 x 16 = 16"), std::string::npos) << tokens;
  std::string width = refusal(tiny_config({"model.ffn_dim=66", "model.heads=4", "parallel.tensor=4"}), 4);
  EXPECT_NE(width.find("model.ffn_dim (66) must be divisible by parallel.tensor (4)"), std::string::npos) << width;
  std::string batch = refusal(tiny_config({"train.batch_size=3", "parallel.replicate=2"}), 2);
  EXPECT_NE(batch.find("train.batch_size (3) is the global batch"), std::string::npos) << batch;
  EXPECT_NE(batch.find("set train.batch_size = 4"), std::string::npos) << batch;
}

TEST(Mesh, OneProcessHasTrivialGroups) {
  Mesh m(tiny_config(), make_single_comm());
  for (const char* g : {"replicate", "shard", "tensor", "ulysses", "ring", "dp", "sp"}) {
    EXPECT_EQ(m.degree(g), 1) << g;
    EXPECT_EQ(m.coord(g), 0) << g;
  }
  EXPECT_THROW(m.group("pipeline"), Error);
}

TEST(Mesh, TrainRefusesAMeshThatDoesNotFitTheLaunch) {
  test::ScratchDir dir("mesh_cli");
  auto r = test::run_process(std::string(VIDIT_BINARY) +
                             " train --set model.dim=32 model.ffn_dim=64 model.layers=1 model.in_channels=4 "
                             "model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 "
                             "data.source=synthetic data.latent_frames=2 data.latent_height=4 data.latent_width=4 "
                             "train.steps=1 train.out_dir=" + dir.path() + " parallel.replicate=2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("= 2, but the job has 1 process; set parallel.replicate = 1 (or launch 2 processes)"),
            std::string::npos) << r.output;
}

// ---- run under mpirun (4 ranks) by the driver below ----

// Sum of the world ranks over a group.
int64_t rank_sum(const Mesh& m, const std::string& group) {
  at::Tensor t = at::full({1}, m.rank(), at::kLong);
  m.group(group)->all_reduce(t, ReduceOp::Sum)->wait();
  return t.item<int64_t>();
}

TEST(MpiWorker, MeshGroups) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  ASSERT_EQ(world->size(), 4);
  const int r = world->rank();
  {
    // 2 replicas x 2-way tensor parallel: tensor fastest, so tensor groups are {0,1} and {2,3}.
    Mesh m(tiny_config({"parallel.replicate=2", "parallel.tensor=2"}), world);
    EXPECT_EQ(m.coord("tensor"), r % 2);
    EXPECT_EQ(m.coord("replicate"), r / 2);
    EXPECT_EQ(m.degree("dp"), 2);
    EXPECT_EQ(m.degree("sp"), 1);
    EXPECT_EQ(rank_sum(m, "tensor"), r / 2 == 0 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(rank_sum(m, "dp"), r % 2 == 0 ? 0 + 2 : 1 + 3);
  }
  {
    // shard 2 x ulysses 2: dp = shard groups {0,2},{1,3}; sp = ulysses groups {0,1},{2,3}.
    Mesh m(tiny_config({"parallel.shard=2", "parallel.ulysses=2"}), world);
    EXPECT_EQ(m.coord("ulysses"), r % 2);
    EXPECT_EQ(m.coord("shard"), r / 2);
    EXPECT_EQ(m.coord("dp"), r / 2);
    EXPECT_EQ(rank_sum(m, "sp"), r / 2 == 0 ? 1 : 5);
    EXPECT_EQ(rank_sum(m, "dp"), r % 2 == 0 ? 2 : 4);
    EXPECT_EQ(rank_sum(m, "replicate"), r);
  }
  {
    // ring 2 x ulysses 2: one 4-way sequence-parallel group.
    Mesh m(tiny_config({"parallel.ring=2", "parallel.ulysses=2"}), world);
    EXPECT_EQ(m.degree("sp"), 4);
    EXPECT_EQ(m.coord("sp"), r);
    EXPECT_EQ(rank_sum(m, "sp"), 6);
    EXPECT_EQ(m.coord("ring"), r / 2);
  }
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, MeshGroupsOn4Ranks) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.MeshGroups"), 4);
}

}  // namespace
}  // namespace vidit
