// A communicator that counts the bytes each collective sends from this rank, the way
// parallel/plan.h counts them (all-reduce 2(n-1)/n of the tensor, all-gather / reduce-scatter /
// all-to-all (n-1)/n of the whole, send the tensor), summed over every group split from it.
// Wrap the world communicator before building the Mesh to measure what a step moves.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace vidit {

class CountingComm : public ForwardingComm {
 public:
  // Bytes by collective name, shared by this communicator and every one split from it.
  using Counts = std::map<std::string, double>;
  explicit CountingComm(std::shared_ptr<Comm> inner, std::shared_ptr<Counts> counts = std::make_shared<Counts>())
      : ForwardingComm(std::move(inner)), counts_(std::move(counts)) {}

  const Counts& counts() const { return *counts_; }
  void reset() { counts_->clear(); }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    add("all_reduce", 2.0 * spread(double(t.nbytes())));
    return ForwardingComm::all_reduce(t, op);
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    add("all_gather", spread(double(out.nbytes())));
    return ForwardingComm::all_gather(in, out);
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    add("reduce_scatter", spread(double(in.nbytes())));
    return ForwardingComm::reduce_scatter(in, out, op);
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    add("all_to_all", spread(double(in.nbytes())));
    return ForwardingComm::all_to_all(in, out);
  }
  WorkPtr broadcast(at::Tensor& t, int root) override {
    add("broadcast", rank() == root ? double(t.nbytes()) : 0.0);
    return ForwardingComm::broadcast(t, root);
  }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    add("send", double(t.nbytes()));
    return ForwardingComm::send(t, dst, tag);
  }
  std::shared_ptr<Comm> split(int color, int key) override {
    return std::make_shared<CountingComm>(inner_->split(color, key), counts_);
  }

 private:
  double spread(double bytes) const { return size() > 1 ? (size() - 1.0) / size() * bytes : 0.0; }
  void add(const char* name, double bytes) {
    if (bytes > 0) (*counts_)[name] += bytes;
  }
  std::shared_ptr<Counts> counts_;
};

}  // namespace vidit
