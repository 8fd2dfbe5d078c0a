#include "diagnose/rank_hosts.h"

#include <cstring>

#include "resilience/run_lock.h"

namespace vidit {

std::vector<std::string> gather_hosts(Comm& world) {
  // 64 bytes per rank, packed into 8 int64 (a dtype every backend reduces and gathers).
  constexpr int64_t kWords = 8;
  char name[kWords * 8] = {0};
  const std::string mine = host_name();
  std::memcpy(name, mine.data(), std::min(mine.size(), sizeof name - 1));
  at::Tensor in = at::empty({kWords}, at::kLong);
  std::memcpy(in.data_ptr(), name, sizeof name);
  at::Tensor all = at::empty({world.size() * kWords}, at::kLong);
  world.all_gather(in, all)->wait();
  std::vector<std::string> hosts;
  const char* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < world.size(); ++r) {
    const char* h = bytes + size_t(r) * sizeof name;
    hosts.emplace_back(h, h + strnlen(h, sizeof name));
  }
  return hosts;
}

std::string rank_and_host(int rank, const std::vector<std::string>& hosts) {
  std::string s = "rank " + std::to_string(rank);
  if (rank >= 0 && size_t(rank) < hosts.size()) s += " (" + hosts[size_t(rank)] + ")";
  return s;
}

}  // namespace vidit
