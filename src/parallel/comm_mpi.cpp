// The MPI communicator: CPU tensors, the non-blocking MPI collectives (MPI_Iallreduce, ...) behind
// each Work. Copies (gather, all-to-all, broadcast, send/recv) move words of the element size
// (an unsigned integer type of 1, 2, 4 or 8 bytes, so MPI's int count reaches 2^31 elements
// rather than 2^31 bytes); reductions
// use the element type, with bf16/fp16 reduced in an fp32 copy. Avg is a sum divided by the size
// when the Work completes. Every MPI call is checked (errors return, not abort) and a failure
// names the operation and MPI's message. A wait gives up after VIDIT_COMM_TIMEOUT_S seconds
// (MpiWork below), so a member that hangs ends the job instead of blocking the others forever.
// The C API only (no deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "parallel/comm_mpi.h"

namespace vidit {
namespace {

std::string mpi_error(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) fail("MPI ", what, " failed: ", mpi_error(rc));
}

void check_tensor(const at::Tensor& t, const char* op, const char* which) {
  VIDIT_CHECK(t.defined(), op, ": the ", which, " tensor is undefined");
  VIDIT_CHECK(t.device().is_cpu() && t.is_contiguous(), op, ": MPI moves contiguous CPU tensors; the ", which,
              " tensor is ", t.device(), t.is_contiguous() ? "" : ", not contiguous");
}

int to_count(int64_t n, const char* op) {
  VIDIT_CHECK(n <= INT_MAX, op, ": ", n, " elements or bytes exceed MPI's int count; split the tensor");
  return static_cast<int>(n);
}


// A copy of `bytes` bytes of elements of `element_size` bytes, as MPI (type, count).
struct Words {
  MPI_Datatype type;
  int count;
};
Words words(int64_t bytes, int64_t element_size, const char* op) {
  switch (element_size) {
    case 2: return {MPI_UINT16_T, to_count(bytes / 2, op)};
    case 4: return {MPI_UINT32_T, to_count(bytes / 4, op)};
    case 8: return {MPI_UINT64_T, to_count(bytes / 8, op)};
    default: return {MPI_BYTE, to_count(bytes, op)};
  }
}

MPI_Datatype element_type(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    default: fail(op, ": cannot reduce ", t, " tensors (fp32, fp64, bf16, fp16, int32, int64 reduce)");
  }
}

MPI_Op reduce_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// One outstanding request. `finish` runs after completion with the request's status.
// Waiting polls MPI_Test, so that a wait can give up: after `timeout` without completion (a
// member hung, or stopped without dying) it throws, naming the operation, instead of blocking
// forever; the caller's error path then ends the job (abort_world). After 10 ms of waiting it
// yields the core between polls.
class MpiWork : public Work {
 public:
  MpiWork(const char* op, std::vector<at::Tensor> keep, int group, double timeout_s)
      : op_(op), keep_(std::move(keep)), group_(group), timeout_s_(timeout_s) {}
  ~MpiWork() override {
    if (!done_) try {
        wait();
      } catch (...) {
      }
  }
  MPI_Request* request() { return &req_; }
  void set_finish(std::function<void(const MPI_Status&)> f) { finish_ = std::move(f); }
  void wait() override {
    if (done_) return;
    done_ = true;
    MPI_Status st;
    int complete = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t polls = 1;; ++polls) {
      check_mpi(MPI_Test(&req_, &complete, &st), op_);
      if (complete) break;
      if (polls % 1024 == 0) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        VIDIT_CHECK(waited < timeout_s_, "MPI ", op_, " in a group of ", group_, " processes did not complete in ",
                    timeout_s_, " s: a member is hung or far behind (VIDIT_COMM_TIMEOUT_S sets this limit)");
        if (waited > 0.01) std::this_thread::yield();
      }
    }
    if (finish_) finish_(st);
    finish_ = nullptr;
    keep_.clear();
  }

 private:
  const char* op_;
  std::vector<at::Tensor> keep_;  // alive until complete
  int group_;
  double timeout_s_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::function<void(const MPI_Status&)> finish_;
  bool done_ = false;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, bool owned, double timeout_s) : comm_(comm), owned_(owned), timeout_s_(timeout_s) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce", "input");
    at::Tensor buf = reduces_in_fp32(t.scalar_type()) ? t.to(at::kFloat) : t;
    check_average(buf, op, "all_reduce");
    auto w = std::make_shared<MpiWork>("Iallreduce", std::vector<at::Tensor>{t, buf}, size_, timeout_s_);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), to_count(buf.numel(), "all_reduce"),
                             element_type(buf.scalar_type(), "all_reduce"), reduce_op(op), comm_, w->request()),
              "Iallreduce");
    w->set_finish([t, buf, op, n = size_](const MPI_Status&) mutable {
      if (op == ReduceOp::Avg) buf.div_(n);
      if (!buf.is_same(t)) t.copy_(buf);
    });
    return w;
  }

  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    check_tensor(in, "all_gather", "input");
    check_tensor(out, "all_gather", "output");
    check_blocks(in, out, size_, "all_gather");
    const Words w_in = words(in.nbytes(), in.element_size(), "all_gather");
    auto w = std::make_shared<MpiWork>("Iallgather", std::vector<at::Tensor>{in, out}, size_, timeout_s_);
    check_mpi(MPI_Iallgather(in.data_ptr(), w_in.count, w_in.type, out.data_ptr(), w_in.count, w_in.type, comm_,
                             w->request()),
              "Iallgather");
    return w;
  }

  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    check_tensor(in, "reduce_scatter", "input");
    check_tensor(out, "reduce_scatter", "output");
    check_blocks(out, in, size_, "reduce_scatter");
    const bool up = reduces_in_fp32(in.scalar_type());
    at::Tensor src = up ? in.to(at::kFloat) : in, dst = up ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : out;
    check_average(dst, op, "reduce_scatter");
    auto w = std::make_shared<MpiWork>("Ireduce_scatter_block", std::vector<at::Tensor>{in, out, src, dst}, size_, timeout_s_);
    check_mpi(MPI_Ireduce_scatter_block(src.data_ptr(), dst.data_ptr(), to_count(dst.numel(), "reduce_scatter"),
                                        element_type(dst.scalar_type(), "reduce_scatter"), reduce_op(op), comm_,
                                        w->request()),
              "Ireduce_scatter_block");
    w->set_finish([out, dst, op, n = size_](const MPI_Status&) mutable {
      if (op == ReduceOp::Avg) dst.div_(n);
      if (!dst.is_same(out)) out.copy_(dst);
    });
    return w;
  }

  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    check_tensor(in, "all_to_all", "input");
    check_tensor(out, "all_to_all", "output");
    VIDIT_CHECK(in.sizes() == out.sizes() && in.scalar_type() == out.scalar_type(), "all_to_all: output ",
                out.sizes(), " ", out.scalar_type(), " must match input ", in.sizes(), " ", in.scalar_type());
    VIDIT_CHECK(in.dim() > 0 && in.size(0) % size_ == 0, "all_to_all: dim 0 of ", in.sizes(),
                " must split evenly over ", size_, " processes");
    VIDIT_CHECK(!in.is_same(out) && in.data_ptr() != out.data_ptr(), "all_to_all: input and output must not alias");
    const Words block = words(in.nbytes() / size_, in.element_size(), "all_to_all");
    auto w = std::make_shared<MpiWork>("Ialltoall", std::vector<at::Tensor>{in, out}, size_, timeout_s_);
    check_mpi(MPI_Ialltoall(in.data_ptr(), block.count, block.type, out.data_ptr(), block.count, block.type, comm_,
                            w->request()),
              "Ialltoall");
    return w;
  }

  WorkPtr broadcast(at::Tensor& t, int root) override {
    check_tensor(t, "broadcast", "input");
    check_peer(root, "broadcast root");
    auto w = std::make_shared<MpiWork>("Ibcast", std::vector<at::Tensor>{t}, size_, timeout_s_);
    const Words all = words(t.nbytes(), t.element_size(), "broadcast");
    check_mpi(MPI_Ibcast(t.data_ptr(), all.count, all.type, root, comm_, w->request()),
              "Ibcast");
    return w;
  }

  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    check_tensor(t, "send", "input");
    check_peer(dst, "send destination");
    auto w = std::make_shared<MpiWork>("Isend", std::vector<at::Tensor>{t}, size_, timeout_s_);
    const Words all = words(t.nbytes(), t.element_size(), "send");
    check_mpi(MPI_Isend(t.data_ptr(), all.count, all.type, dst, tag, comm_, w->request()), "Isend");
    return w;
  }

  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    check_tensor(t, "recv", "output");
    check_peer(src, "recv source");
    auto w = std::make_shared<MpiWork>("Irecv", std::vector<at::Tensor>{t}, size_, timeout_s_);
    const Words all = words(t.nbytes(), t.element_size(), "recv");
    check_mpi(MPI_Irecv(t.data_ptr(), all.count, all.type, src, tag, comm_, w->request()), "Irecv");
    w->set_finish([all, src, bytes = t.nbytes()](const MPI_Status& st) {
      int got = 0;
      MPI_Get_count(&st, all.type, &got);
      VIDIT_CHECK(got == all.count, "recv from rank ", src, ": expected ", bytes, " bytes, got a message of another ",
                  "size; sender and receiver disagree on the tensor's shape or dtype");
    });
    return w;
  }

  void barrier() override {
    MpiWork w("Ibarrier", {}, size_, timeout_s_);
    check_mpi(MPI_Ibarrier(comm_, w.request()), "Ibarrier");
    w.wait();
  }

  std::shared_ptr<Comm> split(int color, int key) override {
    VIDIT_CHECK(color >= 0, "split: color must be >= 0 (got ", color, ")");
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_shared<MpiComm>(sub, true, timeout_s_);
  }

 private:
  // big [size * n, rest...] against small [n, rest...].
  static void check_blocks(const at::Tensor& small, const at::Tensor& big, int size, const char* op) {
    VIDIT_CHECK(small.scalar_type() == big.scalar_type(), op, ": dtypes differ (", small.scalar_type(), " and ",
                big.scalar_type(), ")");
    bool ok = small.dim() > 0 && big.dim() == small.dim() && big.size(0) == small.size(0) * size;
    for (int64_t d = 1; ok && d < small.dim(); ++d) ok = big.size(d) == small.size(d);
    VIDIT_CHECK(ok, op, ": the ", size, "-process tensor must be ", size, " blocks along dim 0 of the per-process ",
                small.sizes(), " (got ", big.sizes(), ")");
  }
  void check_peer(int r, const char* what) const {
    VIDIT_CHECK(r >= 0 && r < size_, what, " ", r, " is not a rank of this ", size_, "-process group");
  }

  MPI_Comm comm_;
  bool owned_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::shared_ptr<Comm> make_mpi_world_comm(std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
    std::atexit(finalize_at_exit);
  }
  return std::make_shared<MpiComm>(MPI_COMM_WORLD, false, timeout.count() / 1000.0);
}

void mpi_abort(int code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace vidit
