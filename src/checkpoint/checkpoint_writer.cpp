#include "checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <set>

#include <torch/cuda.h>

#include "core/error.h"
#include "core/storage.h"

namespace vidit {

CheckpointWriter::~CheckpointWriter() {
  for (Save& s : saves_)
    if (s.thread.joinable()) s.thread.join();
}

SaveReport CheckpointWriter::run(const SaveJob& job) {
  SaveReport r;
  r.step = job.state.step;
  const auto t0 = std::chrono::steady_clock::now();
  Storage& storage = job.storage ? *job.storage : local_storage();
  try {
    if (job.write) r.part = write_checkpoint_part(checkpoint_tmp_dir(job.out_dir, job.state.step), job.state, job.with_ema, storage);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void CheckpointWriter::start(SaveJob job, double blocked_s) {
  VIDIT_CHECK(saves_.size() < 2, "two checkpoint saves are already in flight");
  VIDIT_CHECK(!abandoned_, "the checkpoint writer gave up on a write that did not end; it takes no more saves");
  // Written after the save in flight: one writer at a time on the storage.
  std::shared_future<void> before = saves_.empty() ? std::shared_future<void>() : saves_.back().done;
  auto finished = std::make_shared<std::promise<void>>();
  Save s;
  s.step = job.state.step;
  s.report = std::make_shared<SaveReport>();
  s.done = finished->get_future().share();
  s.thread = std::thread([job = std::move(job), blocked_s, before, finished, report = s.report] {
    if (before.valid()) before.wait();
    try {
      *report = run(job);
    } catch (const std::exception& e) {  // run() reports its own failures; this is a last guard
      report->step = job.state.step, report->error = e.what();
    }
    report->blocked_s = blocked_s;
    finished->set_value();
  });
  saves_.push_back(std::move(s));
}

std::optional<SaveReport> CheckpointWriter::wait(double timeout_s) {
  if (saves_.empty()) return std::nullopt;
  if (timeout_s > 0 && saves_.front().done.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
    SaveReport r;
    r.step = saves_.front().step;
    r.timed_out = true;
    r.error = "its part was not written within " + std::to_string(int64_t(timeout_s)) +
              " s (checkpoint.timeout_s): the storage hangs";
    abandoned_ = true;  // (the write stays in flight: the destructor still waits for it)
    return r;
  }
  Save s = std::move(saves_.front());
  saves_.pop_front();
  s.thread.join();
  return *s.report;
}

std::vector<int64_t> CheckpointWriter::steps() const {
  std::vector<int64_t> out;
  for (const Save& s : saves_) out.push_back(s.step);
  return out;
}

bool CheckpointWriter::finished() const {
  return std::all_of(saves_.begin(), saves_.end(), [](const Save& s) {
    return s.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
}

namespace {
// A host buffer for `t` in `b` unless it already is one.
bool ensure_buffer(const at::Tensor& t, at::Tensor& b) {
  if (b.defined() && b.sizes() == t.sizes() && b.scalar_type() == t.scalar_type()) return false;
  b = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(t.is_cuda()));
  return true;
}
}  // namespace

int64_t reserve_snapshot(const TensorMap& like, TensorMap& buffers) {
  int64_t bytes = 0;
  for (const auto& [key, t] : like) {
    at::Tensor& b = buffers[key];
    if (ensure_buffer(t, b)) b.zero_();  // every page touched now
    bytes += b.nbytes();
  }
  return bytes;
}

TensorMap snapshot(const TensorMap& from, TensorMap& buffers) {
  TensorMap out;
  at::NoGradGuard ng;
  std::set<int> gpus;  // the devices copied from
  for (const auto& [key, t] : from) {
    at::Tensor& b = buffers[key];
    ensure_buffer(t, b);
    // From a GPU into pinned memory the copies are queued back to back on the stream, and one
    // wait below covers them all.
    b.copy_(t.detach(), /*non_blocking=*/t.is_cuda() && b.is_pinned());
    if (t.is_cuda()) gpus.insert(t.get_device());
    out[key] = b;
  }
  for (int gpu : gpus) torch::cuda::synchronize(gpu);
  return out;
}

}  // namespace vidit
