#include "parallel/comm_c10d.h"

#include "core/error.h"

#if defined(VIDIT_HAVE_GLOO) || defined(VIDIT_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef VIDIT_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef VIDIT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>

namespace vidit {
namespace {

bool reduce_in_fp32(const at::Tensor& t) { return reduces_in_fp32(t.scalar_type()); }

c10d::ReduceOp to_c10d(ReduceOp op) { return op == ReduceOp::Max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM; }

// A c10d Work, the tensors it uses (alive until it completes) and what to do after it.
class C10dWork : public Work {
 public:
  C10dWork(const char* op, c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep,
           std::function<void()> finish = {})
      : op_(op), work_(std::move(work)), keep_(std::move(keep)), finish_(std::move(finish)) {}
  ~C10dWork() override {
    if (work_) try {
        wait();
      } catch (...) {
      }
  }
  void wait() override {
    if (!work_) return;
    auto work = std::move(work_);
    try {
      work->wait();
    } catch (const std::exception& e) {
      fail("c10d ", op_, " failed (a member may have died or timed out): ", e.what());
    }
    if (finish_) std::exchange(finish_, nullptr)();
    keep_.clear();
  }

 private:
  const char* op_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> keep_;
  std::function<void()> finish_;
};

struct Engine {
  std::string name;
  std::chrono::milliseconds timeout;
  at::Device device;  // the CPU (gloo) or this process's GPU (nccl)
  // A process group of `size` members over `store`, this one being `rank`.
  c10::intrusive_ptr<c10d::Backend> make(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) const {
#ifdef VIDIT_HAVE_GLOO
    if (name == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    }
#endif
#ifdef VIDIT_HAVE_NCCL
    if (name == "nccl") {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    }
#endif
    fail("communication engine '", name, "' is not in this build");
  }
};

class C10dComm : public Comm {
 public:
  C10dComm(Engine engine, c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size)
      : engine_(std::move(engine)), store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {
    pg_ = engine_.make(c10::make_intrusive<c10d::PrefixStore>(prefix_, store_), rank_, size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return engine_.name; }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    check_average(t, op, "all_reduce");
    std::vector<at::Tensor> bufs = {reduce_in_fp32(t) ? t.to(at::kFloat) : t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = engine_.timeout;
    auto w = pg_->allreduce(bufs, o);
    at::Tensor buf = bufs[0];
    return std::make_shared<C10dWork>("all_reduce", w, std::vector<at::Tensor>{t, buf}, [t, buf, op, n = size_]() mutable {
      if (op == ReduceOp::Avg) buf.div_(n);
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    check(in, "all_gather"), check(out, "all_gather");
    VIDIT_CHECK(out.numel() == in.numel() * size_ && out.scalar_type() == in.scalar_type(), "all_gather: output is ",
                out.numel(), " ", out.scalar_type(), ", expected ", in.numel() * size_, " ", in.scalar_type());
    at::Tensor src = in;
    c10d::AllgatherOptions o;
    o.timeout = engine_.timeout;
    return std::make_shared<C10dWork>("all_gather", pg_->_allgather_base(out, src, o), std::vector<at::Tensor>{in, out});
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    check(in, "reduce_scatter"), check(out, "reduce_scatter");
    check_average(out, op, "reduce_scatter");
    at::Tensor src = reduce_in_fp32(in) ? in.to(at::kFloat) : in;
    at::Tensor dst = reduce_in_fp32(out) ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : out;
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = engine_.timeout;
    auto w = pg_->_reduce_scatter_base(dst, src, o);
    return std::make_shared<C10dWork>("reduce_scatter", w, std::vector<at::Tensor>{in, out, src, dst},
                                      [out, dst, op, n = size_]() mutable {
                                        if (op == ReduceOp::Avg) dst.div_(n);
                                        if (!dst.is_same(out)) out.copy_(dst);
                                      });
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    check(in, "all_to_all"), check(out, "all_to_all");
    at::Tensor src = in;
    std::vector<int64_t> even_out, even_in;  // empty: equal blocks of dim 0
    c10d::AllToAllOptions o;
    o.timeout = engine_.timeout;
    return std::make_shared<C10dWork>("all_to_all", pg_->alltoall_base(out, src, even_out, even_in, o),
                                      std::vector<at::Tensor>{in, out});
  }
  WorkPtr broadcast(at::Tensor& t, int root) override {
    check(t, "broadcast");
    std::vector<at::Tensor> ts = {t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = engine_.timeout;
    return std::make_shared<C10dWork>("broadcast", pg_->broadcast(ts, o), ts);
  }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    check(t, "send");
    std::vector<at::Tensor> ts = {t};
    return std::make_shared<C10dWork>("send", pg_->send(ts, dst, tag), ts);
  }
  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    check(t, "recv");
    std::vector<at::Tensor> ts = {t};
    return std::make_shared<C10dWork>("recv", pg_->recv(ts, src, tag), ts);
  }
  void barrier() override {
    // A tiny all-reduce rather than Backend::barrier, whose NCCL form needs a device guess.
    // On NCCL wait() only orders the current stream after it; reading the result back to the
    // host is what holds this thread until every member has arrived.
    at::Tensor t = at::zeros({1}, options());
    all_reduce(t, ReduceOp::Sum)->wait();
    (void)t.cpu();
  }
  std::shared_ptr<Comm> split(int color, int key) override {
    // Everyone learns every member's (color, key); the members of one color make a new group
    // over their own key prefix. Splits happen in the same order on every member, so the counter
    // names the same split everywhere.
    at::Tensor mine = at::tensor({int64_t(color), int64_t(key)}, at::kLong).to(options().device());
    at::Tensor all = at::empty({2 * size_}, mine.options());
    all_gather(mine, all)->wait();
    all = all.cpu();
    const auto* v = all.data_ptr<int64_t>();
    std::vector<int> members;
    for (int r = 0; r < size_; ++r)
      if (v[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return v[2 * a + 1] < v[2 * b + 1]; });
    const int new_rank = int(std::find(members.begin(), members.end(), rank_) - members.begin());
    const std::string prefix = prefix_ + "/split" + std::to_string(splits_++) + "/color" + std::to_string(color);
    return std::make_shared<C10dComm>(engine_, store_, prefix, new_rank, int(members.size()));
  }

 private:
  at::TensorOptions options() const {
    return at::TensorOptions().dtype(at::kFloat).device(engine_.device);
  }
  void check(const at::Tensor& t, const char* op) const {
    VIDIT_CHECK(t.defined() && t.is_contiguous(), op, " (", engine_.name, "): tensors must be defined and contiguous");
    const bool cuda = engine_.name == "nccl";
    VIDIT_CHECK(t.is_cuda() == cuda, op, ": the ", engine_.name, " engine moves ", cuda ? "CUDA" : "CPU",
                " tensors, this one is on ", t.device());
  }

  Engine engine_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, size_;
  int splits_ = 0;
  c10::intrusive_ptr<c10d::Backend> pg_;
};

}  // namespace

bool have_c10d_engine(const std::string& engine) {
#ifdef VIDIT_HAVE_GLOO
  if (engine == "gloo") return true;
#endif
#ifdef VIDIT_HAVE_NCCL
  if (engine == "nccl") return true;
#endif
  return false;
}

std::shared_ptr<Comm> make_c10d_world_comm(const LaunchEnv& env, const std::string& engine,
                                           std::chrono::milliseconds timeout, at::Device gpu) {
  VIDIT_CHECK(have_c10d_engine(engine), "communication engine '", engine, "' is not in this build",
              engine == "nccl" ? " (it needs a CUDA torch)" : " (install libgloo-dev and reconfigure)");
  VIDIT_CHECK(!env.master_addr.empty() && env.master_port > 0, "rank ", env.rank, " of ", env.world, " (", env.launcher,
              "): set MASTER_ADDR and MASTER_PORT (the host and a free port of rank 0) so the processes can meet");
  // Under torchrun the agent already serves the store at MASTER_ADDR:MASTER_PORT; otherwise rank 0 does.
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  c10d::TCPStoreOptions o;
  o.port = uint16_t(env.master_port);
  o.isServer = env.rank == 0 && !(agent && std::string(agent) == "True");
  o.numWorkers = std::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    fail("rank ", env.rank, ": cannot reach the rendezvous store at ", env.master_addr, ":", env.master_port,
         " (MASTER_ADDR / MASTER_PORT): ", e.what());
  }
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const std::string prefix = std::string("vidit/attempt") + (restart ? restart : "0");
  return std::make_shared<C10dComm>(Engine{engine, timeout, engine == "nccl" ? gpu : at::Device(at::kCPU)}, store,
                                    prefix, env.rank, env.world);
}

}  // namespace vidit

#else  // neither engine in this build

namespace vidit {
bool have_c10d_engine(const std::string&) { return false; }
std::shared_ptr<Comm> make_c10d_world_comm(const LaunchEnv& env, const std::string& engine, std::chrono::milliseconds,
                                           at::Device) {
  fail("rank ", env.rank, " of ", env.world, " (", env.launcher, "): the '", engine,
       "' engine is not in this build (gloo needs libgloo-dev at configure time, nccl a CUDA torch)");
}
}  // namespace vidit

#endif
