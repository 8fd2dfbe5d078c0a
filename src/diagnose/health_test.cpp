// `vidit health` as a real job under mpirun: a healthy launch passes and excludes nothing; with
// one rank made slow by the product's fault injection, that rank is unhealthy, its host goes to
// the exclude list (kept and merged across runs), and the command exits 3.
#include <gtest/gtest.h>

#include <fstream>

#include "../../tests/test_util.h"
#include "diagnose/health.h"
#include "parallel/mpi_test_util.h"
#include "resilience/run_lock.h"

namespace vidit {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(ExcludeList, MergesAndKeepsWhatItHeld) {
  test::ScratchDir dir("exclude");
  const std::string path = dir.path() + "/sub/exclude_hosts.txt";
  EXPECT_EQ(add_to_exclude_list(path, {"node7"}), (std::vector<std::string>{"node7"}));
  EXPECT_EQ(add_to_exclude_list(path, {"node3", "node7"}), (std::vector<std::string>{"node3", "node7"}));
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{"node3", "node7"}));
}

TEST(Health, SlowRankIsUnhealthyAndItsHostExcluded) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("health");
  const std::string cmd = std::string(VIDIT_BINARY) + " health --set train.threads=1 train.out_dir=" + dir.path();
  auto ok = test::mpirun(2, cmd, 120);
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("every host is healthy"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("out_dir from " + host_name() + ": "), std::string::npos) << ok.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "exclude_hosts.txt"));

  // Rank 1's matmul loses 0.5 s in each of its 0.15 s windows: about a quarter of the other's rate.
  auto bad = test::mpirun(2, cmd + " faults.kind=slow faults.rank=1 faults.seconds=0.5", 120);
  EXPECT_EQ(bad.status, 3) << bad.output;
  const size_t row1 = bad.output.find("\n1     " + host_name());
  ASSERT_NE(row1, std::string::npos) << bad.output;
  const std::string line1 = bad.output.substr(row1 + 1, bad.output.find('\n', row1 + 1) - row1 - 1);
  EXPECT_NE(line1.find("UNHEALTHY: matmul"), std::string::npos) << line1;
  const size_t row0 = bad.output.find("\n0     " + host_name());
  ASSERT_NE(row0, std::string::npos) << bad.output;
  EXPECT_NE(bad.output.substr(row0, bad.output.find('\n', row0 + 1) - row0).find(" ok"), std::string::npos) << bad.output;
  EXPECT_EQ(lines_of(dir.path() + "/exclude_hosts.txt"), std::vector<std::string>{host_name()});
}

// train.preflight: vidit train runs the same checks first and does not train on an unhealthy host.
TEST(Health, PreflightStopsTrainingOnAnUnhealthyHost) {
  VIDIT_REQUIRE_MPI();
  test::ScratchDir dir("preflight");
  const std::string cmd = std::string(VIDIT_BINARY) + test::kTinyTrainArgs + dir.path() +
                          " parallel.shard=2 train.preflight=true";
  auto bad = test::mpirun(2, cmd + " faults.kind=slow faults.rank=1 faults.seconds=0.5", 120);
  EXPECT_EQ(bad.status, kUnhealthyStatus) << bad.output;
  EXPECT_NE(bad.output.find("train.preflight: unhealthy host(s); not training"), std::string::npos) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "metrics.jsonl")) << "no step was trained";
  // (A healthy launch passing is Health.SlowRankIsUnhealthyAndItsHostExcluded's first half.)
}

}  // namespace
}  // namespace vidit
