// `vidit health` as a real job under mpirun: a healthy launch passes and excludes nothing; with
// one rank made slow by the product's fault injection, that rank is unhealthy, its host goes to
// the exclude list (kept and merged across runs), and the command exits 3.
//
// The host-wide verdicts, from run_health in real ranks under mpirun that the test tells which
// "host" each is on (one machine plays several): a slow all-reduce among one host's ranks, or a
// slow out_dir write, names that host; the write floor holds with one host; the all-reduce over
// every rank below its floor fails the check without a host to blame, unless the pair rounds
// found one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "../../tests/test_util.h"
#include "diagnose/health.h"
#include "../../tests/mpi_test_util.h"
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
  // Progress from rank 0 (a log, not a terminal): a line per check with what runs next, then the last.
  const auto has = [&](const std::string& out, const std::string& what) {
    return out.find(what) != std::string::npos;
  };
  auto shown = test::mpirun(2, "env VIDIT_PROGRESS_SECONDS=0 " + cmd + " --checks device,storage", 120);
  EXPECT_EQ(shown.status, 0) << shown.output;
  EXPECT_TRUE(has(shown.output, "[health] 0/3 checks 0%")) << shown.output;
  EXPECT_TRUE(has(shown.output, "| next: matmul")) << shown.output;
  EXPECT_TRUE(has(shown.output, "[health] 1/3 checks 33%")) << shown.output;
  EXPECT_TRUE(has(shown.output, "| next: memory bandwidth")) << shown.output;
  EXPECT_TRUE(has(shown.output, "| next: out_dir write")) << shown.output;
  EXPECT_TRUE(has(shown.output, "[health] 3/3 checks 100%")) << shown.output;
  EXPECT_FALSE(has(shown.output, "all-reduce over all")) << shown.output;  // not asked for
  // One final line per printing rank ("took"), whether the ranks' output is a log or a terminal
  // (mpirun may hand them a pty: then the last redraw also reads "3/3").
  size_t per_rank = 0;
  for (size_t at = 0; (at = shown.output.find("checks 100% |", at)) != std::string::npos; ++at) {
    const std::string line = shown.output.substr(at, shown.output.find_first_of("\n\r\x1b", at) - at);
    if (line.find("| took ") != std::string::npos) ++per_rank;
  }
  EXPECT_EQ(per_rank, 1u) << "rank 0 alone shows progress\n" << shown.output;

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

// A scratch out_dir on the RAM disk where there is one: the write rate of a host that is not
// slowed then does not depend on what else the machine's disk is doing.
class RamDir {
 public:
  explicit RamDir(const std::string& tag) {
    const std::string root =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    path_ = root + "/vidit_" + tag + "_" + std::to_string(::getpid());
    std::filesystem::create_directories(path_);
  }
  ~RamDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// run_health in this worker's launch, rank r on hosts[r]; the device checks are left out (they
// are the test above's). Every rank gets the same report; rank 0 prints its table.
HealthReport health_on(const std::vector<std::string>& hosts, HealthOptions o) {
  auto world = make_world_comm(detect_launch_env());
  EXPECT_EQ(world->size(), int(hosts.size()));
  o.check_device = false;
  if (const char* dir = std::getenv("VIDIT_TEST_DIR")) o.out_dir = dir;
  HealthReport r = run_health(*world, hosts, o);
  if (world->rank() == 0) std::printf("%s", r.table.c_str());
  return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Rank 2, on hostB, loses 1 s in each all-reduce it times: hostB's all-reduce among its ranks
// is far below the median of the two hosts' (two hosts: the faster is never below it).
TEST(MpiWorker, HealthSlowAllReduceInsideAHost) {
  VIDIT_MPI_WORKER_ONLY();
  HealthOptions o;
  o.check_storage = false;
  const int rank = detect_launch_env().rank;
  if (rank == 2) o.slow_allreduce_s = 1.0;
  HealthReport r = health_on({"hostA", "hostA", "hostB", "hostB"}, o);
  EXPECT_EQ(r.bad_hosts, std::vector<std::string>{"hostB"});
  EXPECT_FALSE(r.healthy());
  EXPECT_FALSE(r.network_slow);
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_TRUE(has(r.ranks[2].why, "all-reduce inside host hostB: ")) << r.ranks[2].why;
  EXPECT_TRUE(has(r.ranks[2].why, " GB/s, below 0.7 x the median ")) << r.ranks[2].why;
  EXPECT_TRUE(r.ranks[0].ok && r.ranks[1].ok && r.ranks[3].ok) << r.table;
}

// hostB's first rank loses 1.5 s in its timed write of out_dir; no floor, the median alone.
TEST(MpiWorker, HealthSlowWriteOnAHost) {
  VIDIT_MPI_WORKER_ONLY();
  HealthOptions o;
  o.check_network = false;
  o.min_write_mbs = 0;
  if (detect_launch_env().rank == 1) o.slow_write_s = 1.5;
  HealthReport r = health_on({"hostA", "hostB"}, o);
  EXPECT_EQ(r.bad_hosts, std::vector<std::string>{"hostB"});
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_TRUE(has(r.ranks[1].why, "out_dir write from hostB: ")) << r.ranks[1].why;
  EXPECT_TRUE(has(r.ranks[1].why, " MB/s, below 0.7 x the median ")) << r.ranks[1].why;
  EXPECT_TRUE(r.ranks[0].ok) << r.table;
}

// One host: nothing to compare with, so only the floors can fail it. With the defaults (write
// floor 20 MB/s, no world floor) it is healthy; with floors no machine reaches, its write names
// it and the world all-reduce fails the check with no host to blame.
TEST(MpiWorker, HealthFloorsWithOneHost) {
  VIDIT_MPI_WORKER_ONLY();
  HealthReport fine = health_on({"hostA", "hostA"}, HealthOptions{});
  EXPECT_TRUE(fine.healthy()) << fine.table;
  HealthOptions o;
  o.min_write_mbs = 1e6;
  o.min_world_allreduce_gbs = 1e6;
  HealthReport r = health_on({"hostA", "hostA"}, o);
  EXPECT_EQ(r.bad_hosts, std::vector<std::string>{"hostA"});
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_TRUE(has(r.ranks[0].why, "out_dir write from hostA: ")) << r.ranks[0].why;
  EXPECT_TRUE(has(r.ranks[0].why, " MB/s, below the floor 1000000")) << r.ranks[0].why;
  EXPECT_FALSE(has(r.ranks[0].why, "all-reduce inside")) << "one host has no median to be below";
  EXPECT_TRUE(r.network_slow);
  EXPECT_TRUE(r.network_hosts.empty());
  EXPECT_TRUE(has(r.table, "below the floor 1000000: the network is slow; no single host is to blame")) << r.table;
}

// Four hosts of one rank; hostD's rank loses 0.5 s in each all-reduce it times, so both its
// pairs are slow and the others fast: below the world floor, the report names hostD.
TEST(MpiWorker, HealthSlowNetworkNamesThePairRoundsHost) {
  VIDIT_MPI_WORKER_ONLY();
  HealthOptions o;
  o.check_storage = false;
  o.min_world_allreduce_gbs = 1e6;
  if (detect_launch_env().rank == 3) o.slow_allreduce_s = 0.5;
  HealthReport r = health_on({"hostA", "hostB", "hostC", "hostD"}, o);
  EXPECT_TRUE(r.network_slow);
  EXPECT_EQ(r.network_hosts, std::vector<std::string>{"hostD"});
  EXPECT_EQ(r.bad_hosts, std::vector<std::string>{"hostD"});
  EXPECT_TRUE(r.slow_links.empty()) << r.table;
  EXPECT_TRUE(has(r.table, "the network is slow; the pair rounds name hostD")) << r.table;
}

TEST(Health, SlowAllReduceInsideAHostMakesItUnhealthy) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.HealthSlowAllReduceInsideAHost"), 4);
}

TEST(Health, SlowOutDirWriteMakesItsHostUnhealthy) {
  VIDIT_REQUIRE_MPI();
  RamDir dir("health_write");
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.HealthSlowWriteOnAHost", "VIDIT_TEST_DIR=" + dir.path()),
                              2);
}

TEST(Health, WriteAndWorldAllReduceFloors) {
  VIDIT_REQUIRE_MPI();
  RamDir dir("health_floor");
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.HealthFloorsWithOneHost", "VIDIT_TEST_DIR=" + dir.path()),
                              2);
}

TEST(Health, SlowNetworkNamesTheHostThePairRoundsFind) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(4, "MpiWorker.HealthSlowNetworkNamesThePairRoundsHost"), 4);
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
