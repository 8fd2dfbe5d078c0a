#include "diagnose/group_bandwidth.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

namespace vidit {
namespace {

constexpr const char* kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"};
constexpr int kNumOps = int(std::size(kOps));

std::vector<std::string> group_names() {
  std::vector<std::string> names(kMeshGroups.begin(), kMeshGroups.end());
  names.push_back("world");
  return names;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void judge_groups(std::vector<GroupBandwidth>& rows) {
  for (GroupBandwidth& g : rows) {
    std::vector<double> others;
    for (const GroupBandwidth& o : rows)
      if (o.group == g.group && o.op == g.op && o.instance != g.instance && o.bus_bytes >= kMinJudgedBytes)
        others.push_back(o.wait_s);
    g.others_wait_s = others.empty() ? 0 : median(others);
    g.slow = g.bus_bytes >= kMinJudgedBytes && !others.empty() && g.wait_s * kSlowGroupRatio > g.others_wait_s &&
             g.wait_s - g.others_wait_s >= kMinExcessPerCall * double(g.calls);
  }
}

std::vector<GroupBandwidth> gather_group_bandwidth(const Mesh& mesh) {
  const std::vector<std::string> names = group_names();
  const int per_group = 1 + 4 * kNumOps;  // instance, then (bus bytes, in flight, blocked, calls) per op
  const int width = int(names.size()) * per_group;
  const CommTimes times = mesh.comm_times();
  at::Tensor mine = at::zeros({width}, at::kDouble);
  double* m = mine.data_ptr<double>();
  for (size_t g = 0; g < names.size(); ++g) {
    double* row = m + g * per_group;
    const bool whole = names[g] == "world";
    const int size = whole ? mesh.size() : mesh.degree(names[g]);
    row[0] = size > 1 ? (whole ? 0 : mesh.instance(names[g])) : -1;
    auto it = times.by_group.find(names[g]);
    if (it == times.by_group.end()) continue;
    for (int o = 0; o < kNumOps; ++o) {
      auto t = it->second.find(kOps[o]);
      if (t == it->second.end()) continue;
      double* v = row + 1 + 4 * o;
      v[0] = t->second.bus_bytes, v[1] = t->second.span_s, v[2] = t->second.wait_s, v[3] = double(t->second.calls);
    }
  }
  at::Tensor all = at::empty({mesh.size() * width}, at::kDouble);
  mesh.world()->all_gather(mine, all)->wait();
  const double* a = all.data_ptr<double>();
  // (group, op, instance) -> the row being built.
  std::map<std::tuple<size_t, int, int>, GroupBandwidth> rows;
  std::map<std::pair<size_t, int>, std::vector<int>> members;
  for (int r = 0; r < mesh.size(); ++r)
    for (size_t g = 0; g < names.size(); ++g)
      if (const int instance = int(a[r * width + g * per_group]); instance >= 0) members[{g, instance}].push_back(r);
  for (int r = 0; r < mesh.size(); ++r)
    for (size_t g = 0; g < names.size(); ++g) {
      const double* row = a + r * width + g * per_group;
      const int instance = int(row[0]);
      if (instance < 0) continue;
      for (int o = 0; o < kNumOps; ++o) {
        const double* v = row + 1 + 4 * o;
        const double bytes = v[0], secs = v[1], wait = v[2], calls = v[3];
        if (calls <= 0) continue;
        GroupBandwidth& b = rows[{g, o, instance}];
        if (b.calls == 0) b.group = names[g], b.op = kOps[o], b.instance = instance, b.seconds = secs, b.wait_s = wait;
        b.ranks = members[{g, instance}];
        b.bus_bytes = std::max(b.bus_bytes, bytes);
        b.seconds = std::min(b.seconds, secs);
        b.wait_s = std::min(b.wait_s, wait);
        b.calls = std::max(b.calls, int64_t(calls));
      }
    }
  std::vector<GroupBandwidth> out;
  for (auto& [key, b] : rows) {
    b.gbps = b.seconds > 0 ? b.bus_bytes / b.seconds / 1e9 : 0;
    out.push_back(std::move(b));
  }
  judge_groups(out);
  return out;
}

std::string describe_group(const GroupBandwidth& g, const std::vector<std::string>& hosts) {
  std::ostringstream s;
  s << g.group << " group " << g.instance << " (";
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    const int r = g.ranks[i];
    s << (i ? ", " : "") << "rank " << r;
    if (r < int(hosts.size())) s << " on " << hosts[size_t(r)];
  }
  s << ")";
  return s.str();
}

}  // namespace vidit
