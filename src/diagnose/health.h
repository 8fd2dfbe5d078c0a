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
// The CPU versions of the same checks run on a CPU machine. Node-pair all-reduce rounds (to
// isolate a bad link between hosts) are left for when several hosts can be tested.
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>

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
};

struct RankHealth {
  int rank = 0;
  std::string host;
  double matmul_gflops = 0, memory_gbs = 0, matmul_score = 1, memory_score = 1;
  bool ok = true;
  std::string why;
};

struct HealthReport {
  std::vector<RankHealth> ranks;
  std::vector<std::string> bad_hosts;  // sorted
  double world_allreduce_gbs = 0;      // bus bandwidth of an 8 MiB all-reduce over every rank
  std::vector<std::pair<std::string, double>> host_allreduce_gbs, host_write_mbs, host_free_gb;
  std::string table;                   // for the console
};

// Collective over `world`; every rank returns the same report. `hosts`: gather_hosts().
HealthReport run_health(Comm& world, const std::vector<std::string>& hosts, const HealthOptions& o);

// Adds `hosts` to the list in `path` (created if missing); returns the whole list.
std::vector<std::string> add_to_exclude_list(const std::string& path, const std::vector<std::string>& hosts);

}  // namespace vidit
