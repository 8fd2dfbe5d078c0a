#include "parallel/launch_env.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace vidit {
namespace {

struct Reader {
  const std::function<const char*(const char*)>& getenv;
  bool has(const char* name) const { return getenv(name) != nullptr; }
  // An integer variable, or `fallback` when unset.
  int integer(const char* name, int fallback) const {
    const char* v = getenv(name);
    if (!v) return fallback;
    errno = 0;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    VIDIT_CHECK(*v && end && *end == '\0' && errno == 0 && x >= 0 && x < (1L << 30), "launcher environment: ",
                name, "='", v, "' is not a non-negative integer");
    return static_cast<int>(x);
  }
  int required(const char* name, const char* partner) const {
    VIDIT_CHECK(has(name), "launcher environment: ", partner, " is set but ", name,
                " is not; both come from the same launcher, so the environment is incomplete "
                "(unset ", partner, " for a single-process run)");
    return integer(name, 0);
  }
};

}  // namespace

// The variables of each launcher, in order of precedence (see the header).
struct Launcher {
  const char *name, *rank, *world, *local_rank, *local_world;
  bool local_world_may_be_list;  // Slurm: "2(x3),1" when nodes differ; then unknown (0)
};
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", false},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", true},
};

LaunchEnv detect_launch_env(const std::function<const char*(const char*)>& getenv) {
  Reader r{getenv};
  LaunchEnv e;
  const Launcher* l = nullptr;
  for (const Launcher& candidate : kLaunchers)
    if (r.has(candidate.rank) || r.has(candidate.world)) {
      l = &candidate;
      break;
    }
  if (!l) return e;
  e.launcher = l->name;
  e.rank = r.required(l->rank, l->world);
  e.world = r.required(l->world, l->rank);
  e.local_rank = r.integer(l->local_rank, 0);
  const char* per_node = getenv(l->local_world);
  const bool plain = per_node && *per_node && std::string(per_node).find_first_not_of("0123456789") == std::string::npos;
  e.local_world = l->local_world_may_be_list && !plain ? 0 : r.integer(l->local_world, 0);
  // The rendezvous of the c10d engines (gloo, nccl): torchrun sets it; under srun or mpirun the
  // batch script does (scripts/slurm/vidit.sbatch: the job's first host).
  if (const char* a = getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = r.integer("MASTER_PORT", 0);
  const char *rank_var = l->rank, *world_var = l->world, *local_var = l->local_rank;
  VIDIT_CHECK(e.world >= 1, "launcher environment (", e.launcher, "): ", world_var, "=", e.world, " must be >= 1");
  VIDIT_CHECK(e.rank < e.world, "launcher environment (", e.launcher, "): ", rank_var, "=", e.rank,
              " is not below ", world_var, "=", e.world, "; the variables come from different jobs");
  if (e.local_world > 0)
    VIDIT_CHECK(e.local_rank < e.local_world && e.local_world <= e.world, "launcher environment (", e.launcher,
                "): ", local_var, "=", e.local_rank, " does not fit ", e.local_world,
                " processes per node in a world of ", e.world);
  else
    VIDIT_CHECK(e.local_rank < e.world, "launcher environment (", e.launcher, "): ", local_var, "=", e.local_rank,
                " is not below ", world_var, "=", e.world);
  return e;
}

int process_gpu(const LaunchEnv& env, int visible_gpus) {
  return env.local_rank < visible_gpus ? env.local_rank : 0;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace vidit
