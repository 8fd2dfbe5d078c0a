// `vidit health`: pre-flight checks of an allocation, run by the same launcher as training
// (mpirun, torchrun, srun) before a long job. On every rank: matmul throughput and memory
// bandwidth on its device; per host: an all-reduce among its ranks, and the write speed and free
// space of out_dir; over the world: one all-reduce. A rank is unhealthy when its matmul or
// memory figure is below `threshold` x the median over ranks (and, on a GPU whose peak is known,
// below 0.4 x that peak); a host with an unhealthy rank, or whose out_dir cannot take a
// checkpoint, is unhealthy. The hosts found go to an exclude list (one name per line, merged
// with what the file already holds, so a node stays out across restarts) for
// `srun --exclude` / `sbatch --exclude`.
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
  double slow_s = 0;            // fault injection: added inside this rank's timed matmul
  // Which checks run (vidit health --checks): matmul and memory; the all-reduces; out_dir.
  bool check_device = true, check_network = true, check_storage = true;
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
  std::string table;                   // for the console
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
