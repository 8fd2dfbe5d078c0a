// Test helpers for real multi-process runs: start `mpirun --oversubscribe -np N` (as root too)
// on a command, capture its output, exit status and wall time. A worker test (suite MpiWorker)
// runs only inside such a launch: it skips unless VIDIT_MPI_WORKER is set, so the driver test
// that launches it is what CTest runs.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>
#include <string>

#include "parallel/comm.h"
#include "parallel/comm_c10d.h"

namespace vidit::test {

struct ProcessResult {
  int status = -1;     // exit status (timeout(1) gives 124 when it had to kill the launch)
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `command` without the launcher variables of the test's own environment (a test run
// inside a Slurm or torchrun job must not make its children join that job).
inline ProcessResult run_process(const std::string& command) {
  ProcessResult r;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string clean =
      "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS "
      "-u SLURM_LOCALID -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE ";
  FILE* p = popen((clean + command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The mpirun launcher, or "" (with the reason in *why) when this build or machine has none.
inline std::string mpi_launcher(std::string* why) {
#ifdef VIDIT_MPIEXEC
  std::string exe = VIDIT_MPIEXEC;
#else
  std::string exe;
#endif
  if (!have_mpi()) *why = "built without MPI (install openmpi-bin libopenmpi-dev and reconfigure)";
  else if (exe.empty() || !std::filesystem::exists(exe)) *why = "mpirun was not found at configure time";
  else return exe;
  return "";
}

// `np` processes of `command` under mpirun, killed after `limit_s` seconds (then status 124).
inline ProcessResult mpirun(int np, const std::string& command, int limit_s = 120) {
  std::string why, exe = mpi_launcher(&why);
  return run_process("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 VIDIT_MPI_WORKER=1 "
                     "OMPI_MCA_btl=self,vader timeout -k 5 " + std::to_string(limit_s) + " " + exe +
                     " --oversubscribe --bind-to none -np " + std::to_string(np) + " " + command);
}

// This test binary running one worker test under mpirun.
inline ProcessResult mpirun_worker(int np, const std::string& test, const std::string& env = "",
                                   int limit_s = 120) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return mpirun(np, (env.empty() ? "" : "env " + env + " ") + self + " --gtest_color=no --gtest_filter=" + test, limit_s);
}

// The Python this build uses (its torch), and a script of tests/reference/ by file name.
inline std::string python() {
#ifdef VIDIT_PYTHON
  return VIDIT_PYTHON;
#else
  return "python3";
#endif
}
inline std::string reference_script(const std::string& name) {
#ifdef VIDIT_SOURCE_DIR
  return std::string(VIDIT_SOURCE_DIR) + "/tests/reference/" + name;
#else
  return "tests/reference/" + name;
#endif
}

// torchrun (python3 -m torch.distributed.run, from the torch this build uses), or "" (with the
// reason in *why) when it or the `engine` the launch will use is missing.
inline std::string torchrun_launcher(std::string* why, const std::string& engine = "gloo") {
  const std::string py = python();
  if (!have_c10d_engine(engine)) {
    *why = "built without the " + engine + " engine (" +
           (engine == "nccl" ? "it needs a CUDA torch" : "install libgloo-dev and reconfigure") + ")";
    return "";
  }
  if (run_process(py + " -c 'import torch.distributed.run'").status != 0) {
    *why = py + " cannot import torch.distributed.run";
    return "";
  }
  return py + " -m torch.distributed.run";
}

// `np` processes of `command` started by torchrun on this machine (--standalone: it picks the
// rendezvous port), killed after `limit_s` seconds (then status 124).
inline ProcessResult torchrun(int np, const std::string& command, int limit_s = 120,
                              const std::string& engine = "gloo") {
  std::string why, exe = torchrun_launcher(&why, engine);
  return run_process("env VIDIT_MPI_WORKER=1 OMP_NUM_THREADS=1 timeout -k 5 " + std::to_string(limit_s) + " " + exe +
                     " --standalone --nproc-per-node=" + std::to_string(np) + " --no-python " + command);
}

// This test binary running one worker test under torchrun.
inline ProcessResult torchrun_worker(int np, const std::string& test, const std::string& env = "", int limit_s = 120,
                                     const std::string& engine = "gloo") {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return torchrun(np, (env.empty() ? "" : "env " + env + " ") + self + " --gtest_color=no --gtest_filter=" + test,
                  limit_s, engine);
}

// `vidit train` arguments for 4 steps of the tiny model (tests/test_util.h), ending with
// "train.out_dir=" for the caller to complete.
inline const std::string kTinyTrainArgs =
    " train --set model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.in_channels=4 model.patch=[1,2,2] "
    "model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic "
    "data.latent_frames=2 data.latent_height=4 data.latent_width=4 train.batch_size=4 train.threads=1 "
    "train.steps=4 train.log_every=1 train.out_dir=";

// Every rank ran the worker and it passed (not skipped).
inline void expect_workers_passed(const ProcessResult& r, int np) {
  EXPECT_EQ(r.status, 0) << r.output;
  size_t count = 0;
  for (size_t at = r.output.find("[  PASSED  ] 1 test"); at != std::string::npos;
       at = r.output.find("[  PASSED  ] 1 test", at + 1))
    ++count;
  EXPECT_EQ(count, size_t(np)) << r.output;
  EXPECT_EQ(r.output.find("SKIPPED"), std::string::npos) << r.output;
}

// A mesh for a parameterized driver test: its name, ranks, and the --set items its workers get
// through an environment variable (read back with sets_from_env).
struct WorkerMesh {
  const char* name;
  int ranks;
  const char* sets;
};
inline std::string mesh_test_name(const ::testing::TestParamInfo<WorkerMesh>& info) { return info.param.name; }

// Runs worker test `test` on m.ranks ranks with m.sets in environment variable `var` (plus
// `env`), and expects every rank to pass.
inline void run_mesh_worker(const WorkerMesh& m, const std::string& test, const std::string& var,
                            const std::string& env = "") {
  expect_workers_passed(mpirun_worker(m.ranks, test, env + " " + var + "='" + m.sets + "'", 120), m.ranks);
}

inline bool in_mpi_worker() { return std::getenv("VIDIT_MPI_WORKER") != nullptr; }

inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-300);
}

// `sets` followed by the space-separated --set items in environment variable `var` (how a
// driver test passes a mesh to its workers).
inline std::vector<std::string> sets_from_env(const char* var, std::vector<std::string> sets) {
  std::istringstream extra(std::getenv(var) ? std::getenv(var) : "");
  for (std::string s; extra >> s;) sets.push_back(s);
  return sets;
}

// Losses within 1e-5 relative of `want`, step by step.
inline void expect_losses(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]) / want[i], 1e-5) << "step " << i + 1 << ": " << got[i] << " vs " << want[i];
}

// Parameters after training, compared at a scale that does not depend on the CPU, the thread
// count or the order of a reduction: the model as a whole within 1e-5 relative, and each tensor
// within 1e-4 of the larger of its own norm and the size of one optimizer step on it
// (train.lr x sqrt(numel)). AdamW divides each gradient by its running size, so a gradient's
// relative rounding error (which depends on the vector width and the reduction order) becomes the
// step's: parameters with tiny or zero true gradients (attention key biases, to which softmax is
// invariant; output biases late in training) take full-size steps whose direction is rounding,
// and show a few 1e-5 of their own norm on some CPUs. The whole model, dominated by the weights,
// stays at fp32 rounding.
inline void expect_params(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want,
                          double lr) {
  std::vector<at::Tensor> a, b;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_TRUE(it != got.end()) << name;
    at::Tensor g = it->second.detach().to(at::kDouble), wd = w.detach().to(at::kDouble);
    const double scale = std::max(wd.norm().item<double>(), lr * std::sqrt(double(wd.numel())));
    EXPECT_LE((g - wd).norm().item<double>() / scale, 1e-4) << name;
    a.push_back(g.flatten()), b.push_back(wd.flatten());
  }
  EXPECT_LE(rel_err(at::cat(a), at::cat(b)), 1e-5);
}

}  // namespace vidit::test

// First line of a driver test: skips with the reason when MPI is not available.
#define VIDIT_REQUIRE_MPI()                                  \
  do {                                                       \
    std::string why_;                                        \
    if (::vidit::test::mpi_launcher(&why_).empty()) GTEST_SKIP() << why_; \
  } while (0)

// First line of a worker test: it runs only under a driver's mpirun.
#define VIDIT_MPI_WORKER_ONLY()                                                              \
  do {                                                                                       \
    if (!::vidit::test::in_mpi_worker()) GTEST_SKIP() << "runs under mpirun from its driver test"; \
  } while (0)
