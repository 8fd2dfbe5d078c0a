#include "diagnose/crashes.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "diagnose/health.h"

namespace vidit {

std::vector<DeadRank> ranks_that_died(const std::string& dir, const std::vector<std::string>& rank_hosts) {
  namespace fs = std::filesystem;
  std::vector<DeadRank> silent;
  std::set<int> seen;
  std::vector<int64_t> last_ms, entered;  // per silent rank: its last heartbeat, collectives entered
  std::vector<double> blocked;            // and how long it had waited in a collective then
  int spoke = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("rank_", 0) != 0 || f.path().extension() != ".json") continue;
    std::ifstream in(f.path());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    seen.insert(j.value("rank", -1));
    fs::path marker = f.path();
    marker.replace_extension(".signal");  // written by the stop signal's handler itself
    if (!j.value("ended", std::string()).empty() || j.value("signal", 0) != 0 || fs::exists(marker)) {
      ++spoke;
      continue;
    }
    silent.push_back({j.value("rank", -1), j.value("host", std::string()), j.value("phase", std::string()),
                      j.value("step", int64_t(0))});
    last_ms.push_back(j.value("time_ms", int64_t(0)));
    entered.push_back(j.value("collectives", int64_t(-1)));
    blocked.push_back(j.value("blocked_s", 0.0));
  }
  if (spoke == 0 && silent.size() > 1) {
    // Every rank was killed: the first to die stopped beating, and entering collectives, first,
    // while the others went on to wait for it.
    const int64_t newest = *std::max_element(last_ms.begin(), last_ms.end());
    const int64_t most = *std::max_element(entered.begin(), entered.end());
    bool waited = false;
    for (size_t i = 0; i < silent.size(); ++i) waited |= entered[i] == most && blocked[i] > 0;
    if (!waited) return {};
    std::vector<DeadRank> first;
    for (size_t i = 0; i < silent.size(); ++i)
      if (last_ms[i] > 0 && last_ms[i] + kSilentGapMs <= newest && entered[i] < most) first.push_back(silent[i]);
    if (first.empty() || first.size() == silent.size()) return {};
    std::sort(first.begin(), first.end(), [](const DeadRank& a, const DeadRank& b) { return a.rank < b.rank; });
    return first;
  }
  // A rank of the attempt that never wrote one died before its training began.
  for (size_t r = 0; r < rank_hosts.size(); ++r)
    if (!seen.count(int(r))) silent.push_back({int(r), rank_hosts[r], "starting", 0});
  if (spoke == 0) return {};
  std::sort(silent.begin(), silent.end(), [](const DeadRank& a, const DeadRank& b) { return a.rank < b.rank; });
  return silent;
}

std::vector<std::string> note_crashes(const std::string& out_dir, EventLog& events, int64_t step, int64_t after,
                                      const std::string& exclude_file) {
  namespace fs = std::filesystem;
  const std::string dir = out_dir + "/heartbeats";
  if (!fs::exists(dir)) return {};
  // The ranks of the attempt before: the hosts its start named (the event before this attempt's).
  std::map<std::string, int> crashes;  // host -> attempts it crashed in, this one's included
  std::vector<nlohmann::json> starts;
  for (const auto& e : read_events(out_dir)) {
    if (e.value("event", "") == "crashed") ++crashes[e.value("host", "")];
    if (e.value("event", "") == "started" || e.value("event", "") == "resumed") starts.push_back(e);
  }
  std::vector<std::string> rank_hosts;
  if (starts.size() >= 2)
    for (const auto& h : starts[starts.size() - 2].value("rank_hosts", nlohmann::json::array()))
      rank_hosts.push_back(h.get<std::string>());
  const std::vector<DeadRank> dead = ranks_that_died(dir, rank_hosts);
  std::set<std::string> hosts_now;
  for (const DeadRank& d : dead) {
    std::fprintf(stderr, "the previous attempt lost rank %d on %s without a word (killed or crashed; its last heartbeat: %s, "
                         "step %lld)\n",
                 d.rank, d.host.c_str(), d.phase.c_str(), (long long)d.step);
    events.write("crashed", step, {{"rank", d.rank}, {"host", d.host}, {"phase", d.phase}, {"at_step", d.step}});
    hosts_now.insert(d.host);
  }
  std::vector<std::string> excluded;
  for (const std::string& h : hosts_now)
    if (after > 0 && ++crashes[h] >= after) excluded.push_back(h);
  if (!excluded.empty()) {
    const auto all = add_to_exclude_list(exclude_file, excluded);
    for (const std::string& h : excluded) {
      std::fprintf(stderr, "host %s has lost a rank in %d attempts (train.exclude_after_crashes = %lld): added to %s "
                           "(%zu host(s)); start the job without it (srun / sbatch --exclude)\n",
                   h.c_str(), crashes[h], (long long)after, exclude_file.c_str(), all.size());
      events.write("excluded", step, {{"host", h}, {"why", "crashed " + std::to_string(crashes[h]) + " attempts"}});
    }
  }
  std::error_code ec;
  fs::remove_all(dir + ".previous", ec);
  fs::rename(dir, dir + ".previous", ec);
  return excluded;
}

}  // namespace vidit
