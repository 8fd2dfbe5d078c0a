// What a run reports about communication, checked on real processes: TimedComm charges a rank
// the time it waited for a late peer (and not the peer); `vidit train` under mpirun with
// train.trace_steps writes one Chrome trace per rank in which, with FSDP prefetch, the next
// block's all-gather is in flight while the current block computes, and without it never is;
// metrics.jsonl carries the per-step wait; a single process's trace records only while on.
// (A slow rank named in the metrics, and the wait for data, are in src/train/slow_rank_test.cpp.)
#include "parallel/timed_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "../../tests/test_util.h"
#include "core/trace.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {

using test::ScratchDir;

TEST(MpiWorker, TimedCommChargesTheWaitToTheEarlyRank) {
  VIDIT_MPI_WORKER_ONLY();
  TimedComm c(make_world_comm(detect_launch_env()));
  auto sub = c.split(0, c.rank());  // a split shares the totals
  at::Tensor t = at::ones({1024});
  if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sub->all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_EQ(t[0].item<float>(), float(c.size()));
  const CommTimes times = c.times();
  ASSERT_EQ(times.by_op.count("all_reduce"), 1u);
  EXPECT_EQ(times.by_op.at("all_reduce").calls, 1);
  EXPECT_EQ(times.by_op.at("all_reduce").bytes, 4096.0);
  if (c.rank() == 0)
    EXPECT_GE(times.wait_s(), 0.25) << "rank 0 waited for rank 1's 300 ms";
  else
    EXPECT_LT(times.wait_s(), 0.2) << "rank 1 came last and should hardly wait";
  c.reset();
  EXPECT_EQ(c.times().wait_s(), 0.0);
}

TEST(Mpi, TimedCommChargesTheWaitToTheEarlyRank) {
  VIDIT_REQUIRE_MPI();
  test::expect_workers_passed(test::mpirun_worker(2, "MpiWorker.TimedCommChargesTheWaitToTheEarlyRank"), 2);
}

struct Slice {
  std::string name;
  double begin, end;
};

// The complete slices (ph X) and the async collectives (b/e pairs) of one trace file.
void read_trace(const std::string& path, std::vector<Slice>* slices, std::vector<Slice>* collectives, int* pid) {
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  nlohmann::json j = nlohmann::json::parse(in);
  std::map<std::string, Slice> open;
  for (const auto& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M") {
      *pid = e.at("pid");
    } else if (ph == "X") {
      slices->push_back({e.at("name"), e.at("ts"), double(e.at("ts")) + double(e.at("dur"))});
    } else if (ph == "b") {
      open[e.at("id")] = {e.at("name"), e.at("ts"), 0};
    } else if (ph == "e") {
      Slice s = open.at(e.at("id"));
      s.end = e.at("ts");
      collectives->push_back(s);
    }
  }
}

// All-gathers issued inside a block's forward slice and still in flight when it ended.
int gathers_across_forward(const std::vector<Slice>& slices, const std::vector<Slice>& collectives) {
  int n = 0;
  for (const Slice& s : slices) {
    if (s.name.find(" forward") == std::string::npos || s.name.rfind("block ", 0) != 0) continue;
    for (const Slice& c : collectives)
      if (c.name == "all_gather" && c.begin >= s.begin && c.begin <= s.end && c.end > s.end) ++n;
  }
  return n;
}

TEST(Mpi, TraceShowsFsdpPrefetchOverlappingTheBlockForward) {
  VIDIT_REQUIRE_MPI();
  const int blocks = 3, traced = 2;
  for (bool prefetch : {true, false}) {
    SCOPED_TRACE(prefetch ? "prefetch on" : "prefetch off");
    ScratchDir out("trace");
    auto run = test::mpirun(2, std::string(VIDIT_BINARY) + test::kTinyTrainArgs + out.path() +
                                   " model.layers=" + std::to_string(blocks) + " parallel.shard=2 train.trace_steps=" +
                                   std::to_string(traced) + " parallel.prefetch=" + (prefetch ? "true" : "false"));
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("trace of steps 2-3: "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("comm wait "), std::string::npos) << run.output;
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<Slice> slices, collectives;
      int pid = -1;
      read_trace(out.path() + "/trace/rank" + std::to_string(rank) + ".json", &slices, &collectives, &pid);
      EXPECT_EQ(pid, rank);
      auto count = [&](const std::string& name) {
        return std::count_if(slices.begin(), slices.end(), [&](const Slice& s) { return s.name == name; });
      };
      EXPECT_EQ(count("step 2"), 1);
      EXPECT_EQ(count("step 3"), 1);
      EXPECT_EQ(count("step 1") + count("step 4"), 0) << "only steps 2 and 3 are traced";
      EXPECT_EQ(count("forward"), traced);
      EXPECT_EQ(count("backward"), traced);
      for (int b = 0; b < blocks; ++b) {
        EXPECT_EQ(count("block " + std::to_string(b) + " forward"), traced) << b;
        EXPECT_EQ(count("block " + std::to_string(b) + " backward"), traced) << b;
      }
      EXPECT_GT(count("wait all_gather"), 0);
      EXPECT_GT(std::count_if(collectives.begin(), collectives.end(),
                              [](const Slice& c) { return c.name == "reduce_scatter"; }), 0);
      // Prefetch: blocks 1 and 2's gathers are issued during blocks 0 and 1's forward and waited
      // for when their block starts. Without it each gather starts and ends inside its block.
      const int across = gathers_across_forward(slices, collectives);
      if (prefetch)
        EXPECT_EQ(across, (blocks - 1) * traced) << "rank " << rank;
      else
        EXPECT_EQ(across, 0) << "rank " << rank;
    }
    // The per-step wait is logged with the step (rank 0's).
    std::ifstream metrics(out.path() + "/metrics.jsonl");
    std::string line;
    int with_wait = 0;
    while (std::getline(metrics, line)) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("comm_wait_s") && double(j["comm_wait_s"]) >= 0 &&
          double(j["comm_wait_s"]) <= double(j["step_time_s"]))
        ++with_wait;
    }
    EXPECT_EQ(with_wait, 4);
  }
}

// A single process records nothing unless asked, and nests its slices.
TEST(Trace, RecordsOnlyWhileOnAndWritesChromeJson) {
  ScratchDir dir("trace_unit");
  { trace::Span s("before", "test"); }
  trace::start(7, "rank 7");
  {
    trace::Span outer("outer", "test");
    trace::Span inner("inner", "test");
    trace::async_slice("flight", "comm", trace::now_us(), 5.0, {{"bytes", 64}});
  }
  trace::stop();
  { trace::Span s("after", "test"); }
  const std::string path = dir.path() + "/sub/t.json";
  EXPECT_EQ(trace::write(path), 3u);
  std::vector<Slice> slices, collectives;
  int pid = -1;
  read_trace(path, &slices, &collectives, &pid);
  EXPECT_EQ(pid, 7);
  ASSERT_EQ(slices.size(), 2u);
  // Destruction order: inner first.
  EXPECT_EQ(slices[0].name, "inner");
  EXPECT_EQ(slices[1].name, "outer");
  EXPECT_LE(slices[1].begin, slices[0].begin);
  EXPECT_GE(slices[1].end, slices[0].end);
  ASSERT_EQ(collectives.size(), 1u);
  EXPECT_EQ(collectives[0].name, "flight");
  EXPECT_DOUBLE_EQ(collectives[0].end - collectives[0].begin, 5.0);
}

}  // namespace
}  // namespace vidit
