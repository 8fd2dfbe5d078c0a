// Traffic by mesh group, and the slow group among its kind: the run summary's answer to "which
// link is slow". Every rank counts, per group and collective, the bus bytes it moved, the time
// any of them was in flight (issue to the end of the wait, overlapping calls counted once) and
// the time it was blocked waiting for them (parallel/timed_comm.h). At the end of a run one
// all-gather brings every rank's counts together, and for each instance of a group (the "shard"
// group of replica 0, of replica 1, ...) and each collective:
//  - bytes: the most any member moved (members move the same in an SPMD step);
//  - in flight, and blocked: the least of any member. The member that arrived last at each
//    collective waited for nobody, so its figures are the transfer's own: a compute straggler
//    does not make its group look slow through its peers' waiting;
//  - bandwidth: bytes / time in flight, in GB/s. A collective issued early and waited for later
//    (FSDP's prefetch, gradient buckets) is in flight while compute runs, so this is a lower
//    bound on the links' speed, not a measure of them (vidit health measures them).
// The judgement uses the blocked time, which compute does not inflate: an instance that was
// blocked more than 1 / kSlowGroupRatio times the median of the other instances of its kind (same
// group, same collective), and by at least kMinExcessPerCall per call, is slow. The report names
// its ranks and hosts: the links between them, or one of them, is what to check. Kinds with one
// instance, and instances that moved less than kMinJudgedBytes, are reported but not judged.
#pragma once
#include <string>
#include <vector>

#include "parallel/mesh.h"

namespace vidit {

inline constexpr double kSlowGroupRatio = 0.5;
inline constexpr double kMinJudgedBytes = 1e6;
inline constexpr double kMinExcessPerCall = 1e-3;  // seconds

struct GroupBandwidth {
  std::string group, op;      // "shard", "all_gather"
  int instance = 0;           // Mesh::instance
  std::vector<int> ranks;     // its members, by world rank
  double bus_bytes = 0, seconds = 0, wait_s = 0;
  int64_t calls = 0;
  double gbps = 0;            // bus_bytes / seconds / 1e9
  double others_wait_s = 0;   // the median blocked time of the other instances of this kind (0: none)
  bool slow = false;
};

// One row per (group, collective, instance) with traffic, in kMeshGroups then collective order,
// then "world". Collective over the mesh: every rank calls it at the same point.
std::vector<GroupBandwidth> gather_group_bandwidth(const Mesh& mesh);

// The judgement, given every instance's row (gather_group_bandwidth fills `slow`; exposed for
// tests).
void judge_groups(std::vector<GroupBandwidth>& rows);

// "shard group 0 (rank 0 on node0, rank 1 on node1)".
std::string describe_group(const GroupBandwidth& g, const std::vector<std::string>& hosts);

}  // namespace vidit
