// The slow-group judgement on the counts a run gathers (the whole path, from TimedComm's counts
// to the named group, runs between network namespaces in tests/faults/slow_link.sh).
#include "diagnose/group_bandwidth.h"

#include <gtest/gtest.h>

namespace vidit {
namespace {

GroupBandwidth row(const std::string& group, int instance, double wait_s, double bytes = 50e6, int64_t calls = 40) {
  GroupBandwidth g;
  g.group = group, g.op = "all_gather", g.instance = instance, g.bus_bytes = bytes, g.wait_s = wait_s, g.calls = calls;
  g.seconds = wait_s + 1, g.gbps = bytes / g.seconds / 1e9;
  return g;
}

TEST(GroupBandwidth, TheGroupBlockedLongestAmongItsKindIsSlow) {
  std::vector<GroupBandwidth> rows = {row("shard", 0, 0.2), row("shard", 1, 3.5), row("shard", 2, 0.25),
                                      row("shard", 3, 0.22), row("replicate", 0, 0.1), row("replicate", 1, 0.12)};
  judge_groups(rows);
  for (const GroupBandwidth& g : rows) EXPECT_EQ(g.slow, g.group == "shard" && g.instance == 1) << g.group << g.instance;
  EXPECT_DOUBLE_EQ(rows[1].others_wait_s, 0.22);
}

TEST(GroupBandwidth, AloneSmallOrBarelySlowerIsNotJudged) {
  std::vector<GroupBandwidth> alone = {row("dp", 0, 9.0)};
  judge_groups(alone);
  EXPECT_FALSE(alone[0].slow);  // nothing to compare with
  std::vector<GroupBandwidth> small = {row("shard", 0, 0.01), row("shard", 1, 3.0, 1e5)};
  judge_groups(small);
  EXPECT_FALSE(small[1].slow);  // 100 kB: latency, not bandwidth
  // Three times as long, but 0.5 ms per call more: scheduling noise, not a link.
  std::vector<GroupBandwidth> noise = {row("shard", 0, 0.01), row("shard", 1, 0.03)};
  judge_groups(noise);
  EXPECT_FALSE(noise[1].slow);
}

TEST(GroupBandwidth, DescribesItsRanksAndHosts) {
  GroupBandwidth g = row("tensor", 3, 1);
  g.ranks = {6, 7};
  EXPECT_EQ(describe_group(g, {"a", "a", "b", "b", "c", "c", "d", "e"}), "tensor group 3 (rank 6 on d, rank 7 on e)");
}

}  // namespace
}  // namespace vidit
