#include "diagnose/replica_check.h"

#include <map>
#include <sstream>

#include "diagnose/rank_hosts.h"

namespace vidit {

uint64_t weights_fingerprint(const std::vector<const TensorMap*>& maps) {
  at::NoGradGuard ng;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const TensorMap* m : maps)
  for (const auto& [name, t] : *m) {
    if (t.numel() == 0) continue;
    const at::Tensor c = t.detach().contiguous();
    // The raw words of the tensor, as integers of its element size.
    at::ScalarType as = at::kByte;
    switch (c.element_size()) {
      case 2: as = at::kShort; break;
      case 4: as = at::kInt; break;
      case 8: as = at::kLong; break;
      default: break;
    }
    const int64_t sum = c.view(as).sum(at::kLong).item<int64_t>();
    h = (h ^ uint64_t(sum)) * 0x100000001b3ull;  // order-dependent over tensors (FNV-1a step)
  }
  return h;
}

ReplicaVerdict check_replicas(const Mesh& mesh, const std::vector<const TensorMap*>& state, const std::vector<std::string>& hosts,
                              int64_t step) {
  ReplicaVerdict v;
  const int replicas = mesh.degree("replicate") * mesh.degree("ring") * mesh.degree("ulysses");
  if (replicas < 2) return v;  // every rank holds weights no other rank holds: nothing to compare
  const uint64_t fp = weights_fingerprint(state);
  // [fingerprint high 32 bits, low 32 bits, shard coordinate, tensor coordinate] per rank.
  at::Tensor mine = at::tensor({int64_t(fp >> 32), int64_t(fp & 0xffffffffull), int64_t(mesh.coord("shard")),
                                int64_t(mesh.coord("tensor"))},
                               at::kLong);
  const int world = mesh.size();
  at::Tensor all = at::empty({world * 4}, at::kLong);
  mesh.world()->all_gather(mine, all)->wait();
  const int64_t* a = all.data_ptr<int64_t>();
  // Groups of replicas: ranks with the same shard and tensor coordinates.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int, uint64_t>>> groups;
  for (int r = 0; r < world; ++r)
    groups[{a[4 * r + 2], a[4 * r + 3]}].push_back({r, (uint64_t(a[4 * r]) << 32) | uint64_t(a[4 * r + 1])});
  std::ostringstream msg;
  v.detail = nlohmann::json::array();
  for (const auto& [coords, members] : groups) {
    std::map<uint64_t, std::vector<int>> by_fp;
    for (const auto& [r, f] : members) by_fp[f].push_back(r);
    if (by_fp.size() == 1) continue;
    v.consistent = false;
    // The majority: the fingerprint most ranks hold, if strictly more than any other.
    size_t best = 0, second = 0;
    uint64_t majority = 0;
    for (const auto& [f, rs] : by_fp) {
      if (rs.size() > best) second = best, best = rs.size(), majority = f;
      else if (rs.size() > second) second = rs.size();
    }
    const bool has_majority = best > second;
    nlohmann::json group = {{"shard", coords.first}, {"tensor", coords.second}, {"ranks", nlohmann::json::array()}};
    std::vector<int> odd;
    for (const auto& [r, f] : members) {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)f);
      group["ranks"].push_back({{"rank", r}, {"host", size_t(r) < hosts.size() ? hosts[size_t(r)] : ""}, {"fingerprint", hex}});
      if (!has_majority || f != majority) odd.push_back(r);
    }
    v.suspects.insert(v.suspects.end(), odd.begin(), odd.end());
    group["suspects"] = odd;
    v.detail.push_back(group);
    msg << (msg.tellp() > 0 ? "; " : "");
    for (size_t i = 0; i < odd.size(); ++i) msg << (i ? (i + 1 == odd.size() ? " and " : ", ") : "") << rank_and_host(odd[i], hosts);
    if (has_majority)
      msg << (odd.size() == 1 ? " holds" : " hold") << " weights that differ from the other " << best
          << " replicas of the same shard";
    else
      msg << " disagree, with no majority to say which is wrong";
  }
  if (!v.consistent)
    v.message = "silent data corruption after step " + std::to_string(step) + ": " + msg.str() +
                ". The weights of replicas must be equal bit for bit; a flipped bit in memory or a faulty device "
                "does this. Exclude the host named (vidit health) and run the same command: it resumes from the "
                "last checkpoint, which was checked before it was written";
  return v;
}

}  // namespace vidit
