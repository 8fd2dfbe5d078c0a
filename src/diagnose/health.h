// `vidit health`: pre-flight checks of an allocation, run by the same launcher as training
// (mpirun, torchrun, srun) before a long job. On every rank: matmul throughput and memory
// bandwidth on its device; per host: an all-reduce among its ranks, and the write speed and free
// space of out_dir; over the world: one all-reduce. A rank is unhealthy when its matmul or
// memory figure is below `threshold` x the median over ranks (and, on a GPU whose peak is known,
// below 0.4 x that peak). A host is unhealthy when it holds an unhealthy rank; when the
// all-reduce among its ranks is below `threshold` x the median over hosts (two hosts or more
// with two ranks or more each); when its out_dir cannot take a checkpoint, or writes below
// `threshold` x the median over hosts (two hosts or more) or below min_write_mbs (even alone).
// Host-wide reasons are written on the host's first rank. The hosts found go to an exclude list
// (one name per line, merged with what the file already holds, so a node stays out across
// restarts) for `srun --exclude` / `sbatch --exclude`.
//
// The all-reduce over every rank below min_world_allreduce_gbs fails the check as a whole
// (network_slow) without naming a host: a slow fabric is no one node's fault, unless the pair
// rounds below found hosts slow with every neighbour, which the report then names.
//
// Between hosts, node pairs in rounds (DLRover's check): the hosts in a ring, each pair of
// neighbours all-reducing between their first ranks, the pairs of a round at once. A host slow
// with both its neighbours has a bad network and is unhealthy; one slow pair whose hosts are fine
// with their other neighbours is a slow link, named in the report (three hosts or more).
//
// The CPU versions of the same checks run on a CPU machine.
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/config.h"
#include "core/progress.h"
#include "parallel/comm.h"

namespace vidit {

// The exit status of `vidit health` (and of `vidit train` with train.preflight) when a host is
// unhealthy.
inline constexpr int kUnhealthyStatus = 3;

struct HealthOptions {
  double threshold = 0.7;
  at::Device device = at::kCPU;
  std::string out_dir;          // checked for write speed and free space ("" skips)
  double min_free_gb = 0;       // out_dir must have this much free
  double expected_tflops = 0;   // the device's peak for the matmul's dtype (0: unknown)
  double min_write_mbs = 20;    // out_dir write floor (MB/s with fsync), with one host too (0: off)
  double min_world_allreduce_gbs = 0;  // floor of the all-reduce over every rank (bus GB/s; 0: off)
  double slow_s = 0;            // fault injection: added inside this rank's timed matmul
  // Fault injections for tests, each added once inside this rank's timed region: every
  // all-reduce it measures (among its host's ranks, over the world, in the pair rounds); the
  // out_dir write (which a host's first rank does).
  double slow_allreduce_s = 0, slow_write_s = 0;
  // Which checks run (vidit health --checks): matmul and memory; the all-reduces; out_dir.
  bool check_device = true, check_network = true, check_storage = true;
  // Where rank 0 shows how far the checks are (core/progress.h: checks done of those asked for,
  // the one running next, time left at the rate so far); nullptr shows none.
  const Progress::Options* progress = nullptr;
};

struct RankHealth {
  int rank = 0;
  std::string host;
  double matmul_gflops = 0, memory_gbs = 0, matmul_score = 1, memory_score = 1;
  bool ok = true;
  std::string why;
};

// An all-reduce between the first ranks of two hosts (bus bandwidth), in one of the rounds.
struct HostPair {
  std::string a, b;
  double gbs = 0;
  int round = 0;
};

struct HealthReport {
  std::vector<RankHealth> ranks;
  std::vector<std::string> bad_hosts;  // sorted
  double world_allreduce_gbs = 0;      // bus bandwidth of an 8 MiB all-reduce over every rank
  std::vector<std::pair<std::string, double>> host_allreduce_gbs, host_write_mbs, host_free_gb;
  std::vector<HostPair> pairs;          // the node-pair rounds
  std::vector<std::string> slow_links;  // "hostA - hostB": a slow pair whose hosts are otherwise fine
  std::vector<std::string> network_hosts;  // sorted: hosts the pair rounds found slow with every neighbour
  bool network_slow = false;            // world_allreduce_gbs is below min_world_allreduce_gbs
  std::string table;                   // for the console

  // No host to exclude and the network fast enough: what `vidit health`'s exit status reports.
  bool healthy() const { return bad_hosts.empty() && !network_slow; }
};

// Collective over `world`; every rank returns the same report. `hosts`: gather_hosts().
HealthReport run_health(Comm& world, const std::vector<std::string>& hosts, const HealthOptions& o);

// The run's exclude list: train.exclude_file, else <out_dir>/exclude_hosts.txt.
inline std::string exclude_list_path(const TrainConfig& t) {
  return t.exclude_file.empty() ? t.out_dir + "/exclude_hosts.txt" : t.exclude_file;
}

// Adds `hosts` to the list in `path` (created if missing); returns the whole list.
std::vector<std::string> add_to_exclude_list(const std::string& path, const std::vector<std::string>& hosts);

}  // namespace vidit
