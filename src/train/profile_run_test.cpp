// A real run with train.profile_steps (diagnose/profile.h), alone and under mpirun with FSDP:
// its trace holds the ATen ops and our steps, blocks and collective waits of the profiled steps
// only, and the categories of its summary add up to the steps' time.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../../tests/test_util.h"
#include "loader/dataset.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "../../tests/mpi_test_util.h"
#include "train/trainer.h"

namespace vidit {
namespace {

// The trace of a real run, and its summary: categories that add up, the ops and annotations
// that must be there.
void expect_profile(const std::string& out_dir, int rank, bool collectives) {
  const std::string dir = out_dir + "/profile";
  std::ifstream in(dir + "/rank" + std::to_string(rank) + ".json");
  ASSERT_TRUE(in.good()) << dir;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : trace.at("traceEvents"))
    if (e.contains("name")) names.insert(e.at("name").get<std::string>());
  for (const char* want : {"step 2", "step 3", "block 0", "block 1", "aten::mm"})
    EXPECT_TRUE(names.count(want)) << want << " is not in the trace";
  EXPECT_FALSE(names.count("step 1")) << "the profile leaves out the run's first step";
  EXPECT_FALSE(names.count("step 4")) << "the profile is of train.profile_steps steps";
  if (collectives) EXPECT_TRUE(names.count("wait all_gather")) << "FSDP's gathers are not in the trace";
  std::ifstream sj(dir + "/summary_rank" + std::to_string(rank) + ".json");
  const nlohmann::json s = nlohmann::json::parse(sj);
  EXPECT_EQ(s.at("first_step"), 2);
  EXPECT_EQ(s.at("last_step"), 3);
  double sum = 0;
  for (const auto& [c, v] : s.at("host_s").items()) sum += v.get<double>();
  const double window = s.at("window_s").get<double>();
  EXPECT_GT(window, 0);
  EXPECT_NEAR(sum, window, 1e-6 * window);
  EXPECT_GT(s.at("host_s").at("matmul").get<double>(), 0) << s.dump();
  EXPECT_GT(s.at("host_s").at("elementwise").get<double>(), 0) << s.dump();
  EXPECT_GT(s.at("host_s").at("attention").get<double>(), 0) << s.dump();
  if (collectives) EXPECT_GT(s.at("host_s").at("communication").get<double>(), 0) << s.dump();
}

TEST(Profile, ARunWritesItsTraceAndWhereTheTimeWent) {
  test::ScratchDir dir("profile");
  const Config c = test::tiny_config({"train.steps=5", "train.profile_steps=2", "train.out_dir=" + dir.path()});
  Trainer t(c, std::make_shared<SyntheticDataset>(c, 32, 11), at::zeros({c.model.text_len, c.model.text_dim}));
  t.fit(-1, false);
  expect_profile(dir.path(), 0, false);
}

TEST(MpiWorker, ProfileOfAnFsdpRun) {
  VIDIT_MPI_WORKER_ONLY();
  auto world = make_world_comm(detect_launch_env());
  const std::string dir = std::getenv("VIDIT_TEST_DIR");
  const Config c = test::tiny_config({"train.steps=5", "train.profile_steps=2", "train.batch_size=4",
                                      "parallel.shard=2", "train.out_dir=" + dir});
  Trainer t(c, std::make_shared<SyntheticDataset>(c, 32, 11), at::zeros({c.model.text_len, c.model.text_dim}),
            at::kCPU, std::make_shared<Mesh>(c, world));
  t.fit(-1, false);
  expect_profile(dir, world->rank(), true);
  world->barrier();
  if (HasFailure()) abort_world(1);
}

TEST(Mpi, ProfileOfAnFsdpRunOn2Ranks) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("profile_mpi");
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.ProfileOfAnFsdpRun", "VIDIT_TEST_DIR=" + dir.path()), 2);
}

}  // namespace
}  // namespace vidit
