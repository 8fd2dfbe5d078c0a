// The single-process communicator and the choice of the world communicator.
#include "dist/comm.h"

#include "core/error.h"
#include "dist/comm_mpi.h"

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

std::shared_ptr<Comm> make_single_comm() { return std::make_shared<SingleComm>(); }

#ifdef VIDIT_HAVE_MPI
bool have_mpi() { return true; }
std::shared_ptr<Comm> make_world_comm(const LaunchEnv& env) {
  if (env.world == 1) return make_single_comm();
  auto world = make_mpi_world_comm();
  VIDIT_CHECK(world->size() == env.world && world->rank() == env.rank, "the ", env.launcher,
              " environment says rank ", env.rank, " of ", env.world, " but MPI sees rank ", world->rank(), " of ",
              world->size(), ". CPU collectives need processes started by mpirun or srun (--mpi=pmix); "
              "torchrun's processes are joined by the TCPStore/NCCL backend, which this build does not have yet");
  return world;
}
void abort_world(int code) { mpi_abort(code); }
#else
bool have_mpi() { return false; }
std::shared_ptr<Comm> make_world_comm(const LaunchEnv& env) {
  VIDIT_CHECK(env.world == 1, "launched as rank ", env.rank, " of ", env.world, " by ", env.launcher,
              ", but this vidit was built without MPI: install OpenMPI (scripts/install_deps.sh) and "
              "reconfigure with -DVIDIT_MPI=ON");
  return make_single_comm();
}
void abort_world(int) {}
#endif

}  // namespace vidit
