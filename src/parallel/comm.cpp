// The single-process communicator and the choice of the world communicator.
#include "parallel/comm.h"

#include <chrono>
#include <cstdlib>

#include "core/error.h"
#include "parallel/comm_c10d.h"
#include "parallel/comm_mpi.h"
#include "parallel/staging_comm.h"

#include <torch/cuda.h>

namespace vidit {
namespace {

class DoneWork : public Work {
 public:
  explicit DoneWork(std::function<void()> finish) : finish_(std::move(finish)) {}
  void wait() override {
    if (finish_) std::exchange(finish_, nullptr)();
  }

 private:
  std::function<void()> finish_;
};

void copy_if_distinct(const at::Tensor& in, at::Tensor& out, const char* op) {
  VIDIT_CHECK(in.sizes() == out.sizes() && in.scalar_type() == out.scalar_type(), op,
              " (single process): output ", out.sizes(), " ", out.scalar_type(), " must match input ",
              in.sizes(), " ", in.scalar_type());
  if (!in.is_same(out)) out.copy_(in);
}

class SingleComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  WorkPtr all_reduce(at::Tensor&, ReduceOp) override { return completed_work(); }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    copy_if_distinct(in, out, "all_gather");
    return completed_work();
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp) override {
    copy_if_distinct(in, out, "reduce_scatter");
    return completed_work();
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    copy_if_distinct(in, out, "all_to_all");
    return completed_work();
  }
  WorkPtr broadcast(at::Tensor&, int root) override {
    VIDIT_CHECK(root == 0, "broadcast: root ", root, " is not a member of a 1-process group");
    return completed_work();
  }
  WorkPtr send(const at::Tensor&, int dst, int) override {
    fail("send to rank ", dst, ": a 1-process group has no peer");
  }
  WorkPtr recv(at::Tensor&, int src, int) override { fail("recv from rank ", src, ": a 1-process group has no peer"); }
  void barrier() override {}
  std::shared_ptr<Comm> split(int, int) override { return std::make_shared<SingleComm>(); }
};

}  // namespace

WorkPtr completed_work(std::function<void()> finish) { return std::make_shared<DoneWork>(std::move(finish)); }

bool reduces_in_fp32(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

void check_average(const at::Tensor& t, ReduceOp op, const char* name) {
  VIDIT_CHECK(op != ReduceOp::Avg || at::isFloatingType(t.scalar_type()), name,
              ": Avg needs a floating-point tensor (got ", t.scalar_type(), "); use Sum");
}

std::shared_ptr<Comm> make_single_comm() { return std::make_shared<SingleComm>(); }

#ifdef VIDIT_HAVE_MPI
bool have_mpi() { return true; }
void abort_world(int code) { mpi_abort(code); }  // returns when MPI is not running
#else
bool have_mpi() { return false; }
void abort_world(int) {}
#endif

namespace {
at::Device gpu_of(const LaunchEnv& env) {
  return at::Device(at::kCUDA, int8_t(process_gpu(env, int(torch::cuda::device_count()))));
}

std::shared_ptr<Comm> make_engine(const LaunchEnv& env, at::DeviceType device) {
  // One process: no engine, unless a launcher started it and VIDIT_COMM asks for one (e.g. NCCL
  // on one GPU under torchrun, to check it).
  if (env.world == 1 && !(std::getenv("VIDIT_COMM") && env.launcher != "none")) return make_single_comm();
  std::string engine = device == at::kCUDA ? "nccl" : env.launcher == "torchrun" ? "gloo" : "mpi";
  if (const char* chosen = std::getenv("VIDIT_COMM")) engine = chosen;
  // How long a collective may wait for the slowest member before the job is ended, every engine.
  const char* t = std::getenv("VIDIT_COMM_TIMEOUT_S");
  const double seconds = t ? std::atof(t) : 600.0;
  VIDIT_CHECK(seconds > 0, "VIDIT_COMM_TIMEOUT_S = '", t, "' must be a positive number of seconds");
  const auto timeout = std::chrono::milliseconds(int64_t(seconds * 1000));
  if (engine == "gloo" || engine == "nccl") return make_c10d_world_comm(env, engine, timeout, gpu_of(env));
  VIDIT_CHECK(engine == "mpi", "VIDIT_COMM = '", engine, "': the engines are mpi, gloo and nccl");
#ifdef VIDIT_HAVE_MPI
  auto world = make_mpi_world_comm(timeout);
  VIDIT_CHECK(world->size() == env.world && world->rank() == env.rank, "the ", env.launcher,
              " environment says rank ", env.rank, " of ", env.world, " but MPI sees rank ", world->rank(), " of ",
              world->size(), ". The MPI engine needs processes started by mpirun or srun (--mpi=pmix); for "
              "other launchers set VIDIT_COMM=gloo (CPU) or nccl (CUDA) with MASTER_ADDR / MASTER_PORT");
  return world;
#else
  fail("launched as rank ", env.rank, " of ", env.world, " by ", env.launcher,
       ", but this vidit was built without MPI: install OpenMPI (scripts/install_deps.sh) and reconfigure with "
       "-DVIDIT_MPI=ON, or use torchrun (the gloo engine)");
#endif
}
}  // namespace

// Every engine behind the one device rule (staging_comm.h): callers hand over tensors on any device.
std::shared_ptr<Comm> make_world_comm(const LaunchEnv& env, at::DeviceType device) {
  return with_device_rule(make_engine(env, device), gpu_of(env));
}

}  // namespace vidit
