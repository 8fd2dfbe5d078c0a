// The communication part of a run's summary, printed by rank 0 when fit() ends: how long rank 0
// was blocked in each collective, and the bandwidth of each mesh group (diagnose/group_bandwidth.h)
// with the slow group among its kind named on stderr and in events.jsonl ("slow_group").
#include <cstdio>

#include "diagnose/group_bandwidth.h"
#include "diagnose/rank_hosts.h"
#include "train/trainer.h"

namespace vidit {

void Trainer::summarize_communication() {
  if (mesh_->size() == 1) return;
  const std::vector<GroupBandwidth> groups = gather_group_bandwidth(*mesh_);  // collective
  if (!is_lead()) return;
  if (console_) {
    const CommTimes times = mesh_->comm_times();
    std::printf("communication on rank 0 (time blocked in wait, calls, bytes handed over):\n");
    for (const auto& [op, e] : times.by_op)
      std::printf("  %-15s %9.3f s %9lld calls %12.1f MB\n", op.c_str(), e.wait_s, (long long)e.calls, e.bytes / 1e6);
    std::printf("traffic by group (the least of any member: in flight from issue to done, blocked in wait; "
                "bandwidth: bus bytes / in flight, a lower bound where overlapped):\n");
    for (const GroupBandwidth& g : groups)
      std::printf("  %-9s %-2d %-15s %7lld calls %10.3f MB %8.3f s %8.3f s %9.3f GB/s%s\n", g.group.c_str(), g.instance,
                  g.op.c_str(), (long long)g.calls, g.bus_bytes / 1e6, g.seconds, g.wait_s, g.gbps,
                  g.slow ? "  slow" : "");
  }
  for (const GroupBandwidth& g : groups) {
    if (!g.slow) continue;
    // A member that is a compute straggler makes every collective of its group late to start;
    // say so, since then the link may be fine.
    std::string stragglers;
    for (int r : g.ranks)
      if (stragglers_.below(r) >= cfg_.train.straggler_patience) stragglers += (stragglers.empty() ? "" : ", ") + rank_and_host(r, hosts_);
    std::fprintf(stderr,
                 "slow group: %s was blocked %.3f s in %lld %s calls (%.1f MB, %.3f GB/s in flight) against a median "
                 "of %.3f s for the other %s groups: check the links between its hosts (vidit health --checks "
                 "network)%s%s\n",
                 describe_group(g, hosts_).c_str(), g.wait_s, (long long)g.calls, g.op.c_str(), g.bus_bytes / 1e6,
                 g.gbps, g.others_wait_s, g.group.c_str(),
                 stragglers.empty() ? "" : "; but it has a straggler, which may be the cause: ", stragglers.c_str());
    std::vector<std::string> hosts;
    for (int r : g.ranks) hosts.push_back(r < int(hosts_.size()) ? hosts_[size_t(r)] : "");
    events().write("slow_group", step_, {{"group", g.group}, {"instance", g.instance}, {"op", g.op}, {"ranks", g.ranks},
                                         {"hosts", hosts}, {"gbps", g.gbps}, {"wait_s", g.wait_s},
                                         {"others_wait_s", g.others_wait_s}, {"calls", g.calls},
                                         {"straggler", !stragglers.empty()}});
  }
}

}  // namespace vidit
