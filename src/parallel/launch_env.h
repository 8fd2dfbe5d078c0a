// Who am I in a multi-process job: rank, world size and local rank, read from the environment the
// launcher sets. Three launchers are understood, in this order of precedence:
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   OpenMPI   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK/_LOCAL_SIZE
//   Slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ SLURM_NTASKS_PER_NODE)
// torchrun wins over the others because it runs inside Slurm jobs; OpenMPI wins over Slurm because
// `mpirun` inside an allocation leaves the batch step's SLURM_* variables behind. With none of
// them the process is rank 0 of 1. MASTER_ADDR / MASTER_PORT, the rendezvous of the gloo and NCCL
// engines, are read under every launcher (torchrun sets them; a Slurm batch script exports them). Values that contradict each other (a rank outside the world,
// a missing partner variable, text that is not a number) are refused with the variable named.
#pragma once
#include <functional>
#include <string>

namespace vidit {

struct LaunchEnv {
  int rank = 0;          // global rank in [0, world)
  int world = 1;         // number of processes in the job
  int local_rank = 0;    // rank on this node (picks the GPU)
  int local_world = 1;   // processes on this node (0 when the launcher does not say)
  std::string launcher = "none";  // "torchrun", "openmpi", "slurm" or "none"
  std::string master_addr;        // the rendezvous host of the c10d engines (MASTER_ADDR)
  int master_port = 0;            // and its port (MASTER_PORT)
};

// Reads the process environment.
LaunchEnv detect_launch_env();
// This process's GPU index among the `visible_gpus`: its local rank, or 0 when the launcher made
// fewer visible (one per process through CUDA_VISIBLE_DEVICES). The training tensors and the NCCL engine's staged
// tensors both live there.
int process_gpu(const LaunchEnv& env, int visible_gpus);
// Reads through `getenv` (returns nullptr for an unset variable): what tests use.
LaunchEnv detect_launch_env(const std::function<const char*(const char*)>& getenv);

}  // namespace vidit
