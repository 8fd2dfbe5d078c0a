#include "diagnose/health.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace vidit {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void sync(const at::Device& d) {
  if (d.is_cuda()) at::zeros({1}, at::TensorOptions().device(d)).cpu();  // waits for the stream
}

// The median (of two middle values, their mean: with two ranks each is judged against both).
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The best of three windows of `f` (each returns a rate): a device that is really slow is slow
// in every window; a moment of contention on a shared machine is not held against it.
template <class F>
double best_of_three(F&& f) {
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, f());
  return best;
}

// GFLOP/s of square matmuls for about 0.15 s (bf16 on a GPU, fp32 on the CPU).
double matmul_gflops(const HealthOptions& o) {
  const bool gpu = o.device.is_cuda();
  const int64_t n = gpu ? 8192 : 384;
  const auto opts = at::TensorOptions().device(o.device).dtype(gpu ? at::kBFloat16 : at::kFloat);
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts), c = at::matmul(a, b);
  sync(o.device);
  return best_of_three([&] {
    int64_t iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if (o.slow_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.slow_s));
    while (seconds_since(t0) < 0.15 || iters < 2) {
      at::matmul_out(c, a, b);
      ++iters;
      if (gpu && iters % 8 == 0) sync(o.device);
    }
    sync(o.device);
    return 2.0 * double(n) * double(n) * double(n) * double(iters) / seconds_since(t0) / 1e9;
  });
}

// GB/s of copies of a 64 MiB (CPU) / 1 GiB (GPU) buffer (read + write).
double memory_gbs(const HealthOptions& o) {
  const int64_t bytes = o.device.is_cuda() ? (int64_t(1) << 30) : (int64_t(64) << 20);
  const auto opts = at::TensorOptions().device(o.device).dtype(at::kFloat);
  at::Tensor a = at::ones({bytes / 4}, opts), b = at::empty_like(a);
  b.copy_(a);
  sync(o.device);
  return best_of_three([&] {
    int64_t iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < 0.1 || iters < 2) {
      b.copy_(a);
      ++iters;
    }
    sync(o.device);
    return 2.0 * double(bytes) * double(iters) / seconds_since(t0) / 1e9;
  });
}

// A rate in a sentence: three significant digits, whole numbers from 100 up.
std::string num(double v) {
  char b[48];
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : "%.3g", v);
  return b;
}

// A fault injection's pause, inside the region being timed.
void pause_for(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// Bus bandwidth (GB/s) of an 8 MiB fp32 all-reduce over `comm` (0 for one member); `slow_s` is a
// fault injection added to this member's timed region.
double allreduce_gbs(Comm& comm, const at::Device& d, double slow_s = 0) {
  if (comm.size() < 2) return 0;
  const int64_t bytes = int64_t(8) << 20;
  at::Tensor t = at::ones({bytes / 4}, at::TensorOptions().device(d).dtype(at::kFloat));
  comm.all_reduce(t, ReduceOp::Sum)->wait();
  comm.barrier();
  const int iters = 5;
  const auto t0 = std::chrono::steady_clock::now();
  pause_for(slow_s);
  for (int i = 0; i < iters; ++i) comm.all_reduce(t, ReduceOp::Sum)->wait();
  sync(d);
  const double s = seconds_since(t0) / iters, n = double(comm.size());
  return 2 * (n - 1) / n * double(bytes) / s / 1e9;
}

// MB/s of writing 64 MiB to `dir` with fsync (`slow_s`, a fault injection, in the timed region),
// and its free GB.
std::pair<double, double> out_dir_speed(const std::string& dir, const std::string& host, double slow_s) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/.health-" + host + "-" + std::to_string(::getpid());
  std::vector<char> chunk(size_t(8) << 20, 'v');
  const auto t0 = std::chrono::steady_clock::now();
  pause_for(slow_s);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VIDIT_CHECK(fd >= 0, "vidit health: cannot write to out_dir '", dir, "' on ", host, "; check it exists and is writable");
  bool ok = true;
  for (int i = 0; i < 8 && ok; ++i) ok = ::write(fd, chunk.data(), chunk.size()) == ssize_t(chunk.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  const double mbs = ok ? 64.0 * 1.048576 / seconds_since(t0) : 0;
  std::filesystem::remove(path);
  struct statvfs st {};
  const double free_gb = ::statvfs(dir.c_str(), &st) == 0 ? double(st.f_bavail) * double(st.f_frsize) / 1e9 : 0;
  return {mbs, free_gb};
}

struct PairLink {
  int a = 0, b = 0;  // host indices
  int round = 0;
  double gbs = 0;
};

// The hosts in a ring, each next to the following one (and the last to the first): every pair of
// neighbours runs an all-reduce between their first ranks. The pairs are scheduled in rounds in
// which a host is in one pair at most (two rounds for an even number of hosts, three for an odd
// one), the pairs of a round at once. Every host is in two pairs, so a host with a bad network is
// slow in both and a bad link in one. Collective over `world`; every rank returns every pair.
std::vector<PairLink> pair_rounds(Comm& world, const std::vector<std::string>& host_order, int host_index, bool host_lead,
                                  const HealthOptions& o) {
  const int k = int(host_order.size());
  std::vector<PairLink> links;
  if (k < 2) return links;
  for (int i = 0; i < (k == 2 ? 1 : k); ++i) links.push_back({i, (i + 1) % k, 0, 0});
  int rounds = 0;
  for (size_t e = 0; e < links.size(); ++e) {
    for (int r = 0;; ++r) {
      bool free = true;
      for (size_t f = 0; f < e; ++f)
        if (links[f].round == r && (links[f].a == links[e].a || links[f].a == links[e].b || links[f].b == links[e].a ||
                                    links[f].b == links[e].b))
          free = false;
      if (free) {
        links[e].round = r, rounds = std::max(rounds, r + 1);
        break;
      }
    }
  }
  const int n = world.size(), me = world.rank();
  at::Tensor mine = at::zeros({rounds, 2}, at::kDouble);  // per round: link index + 1 (0: none), GB/s
  for (int r = 0; r < rounds; ++r) {
    int color = k + me;  // a communicator of its own: not in a pair this round
    for (size_t e = 0; e < links.size(); ++e)
      if (host_lead && links[e].round == r && (links[e].a == host_index || links[e].b == host_index)) color = int(e);
    std::shared_ptr<Comm> pair = world.split(color, me);
    world.barrier();
    if (color < int(links.size()) && pair->size() == 2) {
      mine[r][0] = double(color + 1);
      mine[r][1] = allreduce_gbs(*pair, o.device, o.slow_allreduce_s);
    }
    world.barrier();
  }
  at::Tensor all = at::empty({n * rounds * 2}, at::kDouble);
  world.all_gather(mine.view(-1), all)->wait();
  const double* a = all.data_ptr<double>();
  std::vector<int> seen(links.size(), 0);
  for (int i = 0; i < n * rounds; ++i) {
    const int e = int(a[2 * i]) - 1;
    if (e < 0) continue;
    links[size_t(e)].gbs += a[2 * i + 1];  // both ends measured it: their mean
    ++seen[size_t(e)];
  }
  for (size_t e = 0; e < links.size(); ++e)
    if (seen[e] > 0) links[e].gbs /= seen[e];
  return links;
}

}  // namespace

HealthReport run_health(Comm& world, const std::vector<std::string>& hosts, const HealthOptions& o) {
  HealthReport rep;
  const int n = world.size(), me = world.rank();
  // Hosts in order of their first rank; each host's lowest rank speaks for its disk.
  std::vector<std::string> host_order;
  for (const auto& h : hosts)
    if (std::find(host_order.begin(), host_order.end(), h) == host_order.end()) host_order.push_back(h);
  const int host_index = int(std::find(host_order.begin(), host_order.end(), hosts[size_t(me)]) - host_order.begin());
  const bool host_lead = std::find(hosts.begin(), hosts.end(), hosts[size_t(me)]) - hosts.begin() == me;

  // The device checks, one rank at a time per host would be fairer to shared CPUs; all at once
  // is what training does, so that is what is measured.
  // The checks in the order they run; rank 0 counts each one off as it ends.
  std::vector<std::string> steps;
  if (o.check_device) steps.insert(steps.end(), {"matmul", "memory bandwidth"});
  if (o.check_network) steps.insert(steps.end(), {"all-reduce inside each host", "all-reduce over all ranks",
                                                  "all-reduce between host pairs"});
  if (o.check_storage && !o.out_dir.empty()) steps.push_back("out_dir write");
  std::unique_ptr<Progress> progress;
  size_t step_done = 0;
  if (o.progress && me == 0) {
    Progress::Options po = *o.progress;
    po.label = "health", po.unit = "check", po.total = int64_t(steps.size());
    progress = std::make_unique<Progress>(po);
    progress->set_note([&](const ProgressSnapshot&) {
      return step_done < steps.size() ? "next: " + steps[step_done] : std::string();
    });
    progress->tick();  // the first line: 0/N, and what runs first
  }
  auto done = [&](int n = 1) {
    for (int i = 0; i < n; ++i) {
      ++step_done;
      if (progress) progress->advance();
    }
  };

  world.barrier();
  const double gflops = o.check_device ? matmul_gflops(o) : 0;
  if (o.check_device) done();
  world.barrier();
  const double gbs = o.check_device ? memory_gbs(o) : 0;
  if (o.check_device) done();
  double node_gbs = 0;
  std::vector<PairLink> links;
  if (o.check_network) {
    std::shared_ptr<Comm> node = world.split(host_index, me);
    node_gbs = allreduce_gbs(*node, o.device, o.slow_allreduce_s);
    done();
    rep.world_allreduce_gbs = allreduce_gbs(world, o.device, o.slow_allreduce_s);
    done();
    links = pair_rounds(world, host_order, host_index, host_lead, o);
    done();
  }
  double write_mbs = -1, free_gb = -1;
  if (o.check_storage && host_lead && !o.out_dir.empty())
    std::tie(write_mbs, free_gb) = out_dir_speed(o.out_dir, hosts[size_t(me)], o.slow_write_s);
  // Rank 0 leads its host, so its write is the host's; the gather below waits for the others.
  if (o.check_storage && !o.out_dir.empty()) done();
  if (progress) progress->finish();

  at::Tensor mine = at::tensor({gflops, gbs, node_gbs, write_mbs, free_gb}, at::kDouble);
  at::Tensor all = at::empty({n * 5}, at::kDouble);
  world.all_gather(mine, all)->wait();
  const double* a = all.data_ptr<double>();
  std::vector<double> mm, mem;
  for (int r = 0; r < n; ++r) mm.push_back(a[5 * r]), mem.push_back(a[5 * r + 1]);
  const double mm_med = median(mm), mem_med = median(mem);
  std::set<std::string> bad;
  for (int r = 0; r < n; ++r) {
    RankHealth h;
    h.rank = r, h.host = hosts[size_t(r)];
    h.matmul_gflops = a[5 * r], h.memory_gbs = a[5 * r + 1];
    h.matmul_score = mm_med > 0 ? h.matmul_gflops / mm_med : 1;
    h.memory_score = mem_med > 0 ? h.memory_gbs / mem_med : 1;
    std::vector<std::string> why;
    if (h.matmul_score < o.threshold) why.push_back("matmul " + std::to_string(int(100 * h.matmul_score)) + "% of the median");
    if (h.memory_score < o.threshold) why.push_back("memory " + std::to_string(int(100 * h.memory_score)) + "% of the median");
    if (o.check_device && o.expected_tflops > 0 && h.matmul_gflops < 0.4 * o.expected_tflops * 1e3)
      why.push_back("matmul below 0.4 x the device's peak");
    if (a[5 * r + 3] >= 0) {
      rep.host_write_mbs.push_back({h.host, a[5 * r + 3]});
      rep.host_free_gb.push_back({h.host, a[5 * r + 4]});
      if (a[5 * r + 3] == 0) why.push_back("out_dir write failed");
      if (a[5 * r + 4] < o.min_free_gb) why.push_back("out_dir has " + std::to_string(int(a[5 * r + 4])) + " GB free");
    }
    if (a[5 * r + 2] > 0 && std::find(hosts.begin(), hosts.end(), h.host) - hosts.begin() == r)
      rep.host_allreduce_gbs.push_back({h.host, a[5 * r + 2]});
    for (size_t i = 0; i < why.size(); ++i) h.why += (i ? ", " : "") + why[i];
    h.ok = why.empty();
    if (!h.ok) bad.insert(h.host);
    rep.ranks.push_back(h);
  }
  // A host-wide reason goes on the host's first rank, as out_dir's do.
  auto blame_host = [&](const std::string& host, const std::string& why) {
    bad.insert(host);
    for (RankHealth& r : rep.ranks)
      if (r.host == host) {
        r.ok = false;
        r.why += (r.why.empty() ? "" : ", ") + why;
        return;
      }
  };
  // Per host: the all-reduce among its ranks and the out_dir write, against the median over
  // hosts (a host alone has none to be compared with) and, for the write, against a floor.
  const std::string below_median = ", below " + num(o.threshold) + " x the median ";
  std::vector<double> node_rates, write_rates;
  for (const auto& hg : rep.host_allreduce_gbs) node_rates.push_back(hg.second);
  for (const auto& hw : rep.host_write_mbs) write_rates.push_back(hw.second);
  const double node_med = median(node_rates), write_med = median(write_rates);
  if (node_rates.size() >= 2)
    for (const auto& [host, g] : rep.host_allreduce_gbs)
      if (g < o.threshold * node_med)
        blame_host(host, "all-reduce inside host " + host + ": " + num(g) + " GB/s" + below_median + num(node_med));
  for (const auto& [host, w] : rep.host_write_mbs) {
    if (w == 0) continue;  // "out_dir write failed" already
    std::string why;
    if (write_rates.size() >= 2 && w < o.threshold * write_med) why = below_median + num(write_med);
    if (o.min_write_mbs > 0 && w < o.min_write_mbs)
      why += (why.empty() ? ", below the floor " : " and the floor ") + num(o.min_write_mbs);
    if (!why.empty()) blame_host(host, "out_dir write from " + host + ": " + num(w) + " MB/s" + why);
  }
  // Links: a host whose every pair is slow has a bad network (it is excluded); a slow pair whose
  // hosts are fine otherwise is a bad link between them (named, not excluded: neither host is
  // to blame).
  std::vector<double> rates;
  for (const PairLink& l : links) rates.push_back(l.gbs);
  const double link_med = median(rates);
  for (const PairLink& l : links) rep.pairs.push_back({host_order[size_t(l.a)], host_order[size_t(l.b)], l.gbs, l.round});
  if (links.size() >= 3) {
    auto slow = [&](const PairLink& l) { return l.gbs < o.threshold * link_med; };
    for (int h = 0; h < int(host_order.size()); ++h) {
      int mine = 0, slow_mine = 0;
      for (const PairLink& l : links)
        if (l.a == h || l.b == h) ++mine, slow_mine += slow(l);
      if (mine >= 2 && slow_mine == mine) {
        bad.insert(host_order[size_t(h)]);
        rep.network_hosts.push_back(host_order[size_t(h)]);
        for (RankHealth& r : rep.ranks)
          if (r.host == host_order[size_t(h)]) {
            r.ok = false;
            r.why += std::string(r.why.empty() ? "" : ", ") + "all-reduce with every neighbour host below " +
                     std::to_string(int(100 * o.threshold)) + "% of the median pair";
          }
      }
    }
    for (const PairLink& l : links)
      if (slow(l) && !bad.count(host_order[size_t(l.a)]) && !bad.count(host_order[size_t(l.b)]))
        rep.slow_links.push_back(host_order[size_t(l.a)] + " - " + host_order[size_t(l.b)]);
  }
  rep.bad_hosts.assign(bad.begin(), bad.end());
  std::sort(rep.network_hosts.begin(), rep.network_hosts.end());
  // The world all-reduce: a floor for the fabric as a whole. It names no host by itself; the pair
  // rounds may have named some.
  std::string network_verdict;
  if (o.check_network && n > 1 && o.min_world_allreduce_gbs > 0 && rep.world_allreduce_gbs < o.min_world_allreduce_gbs) {
    rep.network_slow = true;
    network_verdict = ", below the floor " + num(o.min_world_allreduce_gbs) + ": the network is slow; ";
    if (rep.network_hosts.empty()) {
      network_verdict += "no single host is to blame (none is slow with every neighbour in the pair rounds)";
    } else {
      network_verdict += "the pair rounds name";
      for (const auto& x : rep.network_hosts) network_verdict += " " + x;
    }
  }

  std::ostringstream t;
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-20s %16s %7s %12s %7s  %s\n", "rank", "host",
                o.device.is_cuda() ? "matmul TFLOP/s" : "matmul GFLOP/s", "score", "memory GB/s", "score", "verdict");
  t << line;
  for (const RankHealth& h : rep.ranks) {
    if (!o.check_device) {
      std::snprintf(line, sizeof line, "%-5d %-20s %16s %7s %12s %7s  %s\n", h.rank, h.host.c_str(), "-", "-", "-", "-",
                    h.ok ? "ok" : ("UNHEALTHY: " + h.why).c_str());
      t << line;
      continue;
    }
    std::snprintf(line, sizeof line, "%-5d %-20s %16.1f %7.2f %12.1f %7.2f  %s\n", h.rank, h.host.c_str(),
                  o.device.is_cuda() ? h.matmul_gflops / 1e3 : h.matmul_gflops, h.matmul_score, h.memory_gbs,
                  h.memory_score, h.ok ? "ok" : ("UNHEALTHY: " + h.why).c_str());
    t << line;
  }
  for (const auto& [host, g] : rep.host_allreduce_gbs) t << "all-reduce inside " << host << ": " << g << " GB/s (bus)\n";
  if (n > 1 && o.check_network)
    t << "all-reduce over all " << n << " ranks: " << rep.world_allreduce_gbs << " GB/s (bus)" << network_verdict << "\n";
  for (const HostPair& p : rep.pairs) {
    const std::string link = p.a + " - " + p.b;
    const bool slow_link = std::find(rep.slow_links.begin(), rep.slow_links.end(), link) != rep.slow_links.end();
    t << "all-reduce between " << link << " (round " << p.round + 1 << "): " << p.gbs << " GB/s (bus)"
      << (slow_link ? "  SLOW LINK" : "") << "\n";
  }
  for (size_t i = 0; i < rep.host_write_mbs.size(); ++i)
    t << "out_dir from " << rep.host_write_mbs[i].first << ": " << int(rep.host_write_mbs[i].second) << " MB/s with fsync, "
      << int(rep.host_free_gb[i].second) << " GB free\n";
  rep.table = t.str();
  return rep;
}

std::vector<std::string> add_to_exclude_list(const std::string& path, const std::vector<std::string>& hosts) {
  std::set<std::string> all(hosts.begin(), hosts.end());
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '#') all.insert(line);
  }
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& h : all) out << h << "\n";
    VIDIT_CHECK(out, "cannot write the exclude list '", path, "'");
  }
  std::filesystem::rename(tmp, path);
  return {all.begin(), all.end()};
}

}  // namespace vidit
