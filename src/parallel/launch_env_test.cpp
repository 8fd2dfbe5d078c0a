// Rank discovery from torchrun, OpenMPI and Slurm variables, their precedence and the refusals.
#include "parallel/launch_env.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace vidit {
namespace {

LaunchEnv detect(const std::map<std::string, std::string>& vars) {
  return detect_launch_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    detect(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NoLauncherIsRankZeroOfOne) {
  LaunchEnv e = detect({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world, 1);
  EXPECT_EQ(e.launcher, "none");
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv e = detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, OpenMpiAndSlurm) {
  LaunchEnv o = detect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(o.launcher, "openmpi");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world, 4);
  EXPECT_EQ(o.local_rank, 1);
  LaunchEnv s = detect({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"},
                        {"SLURM_NTASKS_PER_NODE", "8"}});
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.world, 16);
  EXPECT_EQ(s.local_world, 8);
  // srun with a c10d engine (NCCL across nodes): the batch script's rendezvous is read too.
  LaunchEnv g = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}});
  EXPECT_EQ(g.master_addr, "node0");
  EXPECT_EQ(g.master_port, 29400);
  // A list form of tasks per node says nothing usable about this node.
  EXPECT_EQ(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_NTASKS_PER_NODE", "2(x2),1"}}).local_world, 0);
}

TEST(LaunchEnv, Precedence) {
  // mpirun inside a Slurm allocation: the batch step's SLURM_* are stale, OpenMPI's are true.
  LaunchEnv e = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 1);
  // torchrun inside Slurm: torchrun's own numbering wins.
  LaunchEnv t = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.world, 4);
}

TEST(LaunchEnv, InconsistentValuesAreRefusedNamingTheVariable) {
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "2"}}).find("SLURM_PROCID='x1' is not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}).find("OMPI_COMM_WORLD_SIZE=0"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}})
                .find("LOCAL_RANK=4"),
            std::string::npos);
}

}  // namespace
}  // namespace vidit

namespace vidit {
namespace {

// The GPU of a process: its local rank when every GPU of the node is visible, 0 when the
// launcher narrowed each process to one (CUDA_VISIBLE_DEVICES).
TEST(LaunchEnv, ProcessGpuIsTheLocalRankOrTheOnlyVisibleOne) {
  LaunchEnv env;
  env.local_rank = 3;
  EXPECT_EQ(process_gpu(env, 8), 3);
  EXPECT_EQ(process_gpu(env, 1), 0);
  env.local_rank = 0;
  EXPECT_EQ(process_gpu(env, 0), 0);
}

}  // namespace
}  // namespace vidit
