#include "train/checkpoint_writer.h"

#include <chrono>

#include "core/error.h"
#include "core/storage.h"

namespace vidit {

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

SaveReport CheckpointWriter::run(const SaveJob& job) {
  SaveReport r;
  r.step = job.state.step;
  const auto t0 = std::chrono::steady_clock::now();
  Storage& storage = job.storage ? *job.storage : local_storage();
  const std::string tmp = checkpoint_tmp_dir(job.out_dir, job.state.step);
  try {
    if (job.write) r.bytes = write_checkpoint_part(tmp, job.state, job.with_ema, storage);
  } catch (const std::exception& e) {
    r.error = e.what();
    // The commit (rank 0) stops waiting for this part once it reads why.
    fail_checkpoint_part(tmp, job.state.part, r.error, local_storage());
  }
  if (job.commit && r.error.empty()) {
    try {
      r.dir = commit_checkpoint(job.out_dir, job.state, job.keep, job.keep_every, storage, job.timeout_s);
    } catch (const std::exception& e) {
      r.error = e.what();
      r.in_commit = true;
    }
  }
  r.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void CheckpointWriter::start(SaveJob job, double blocked_s) {
  VIDIT_CHECK(!thread_.joinable(), "a checkpoint save is already in flight");
  report_ = SaveReport{};
  finished_ = false;
  thread_ = std::thread([this, job = std::move(job), blocked_s] {
    report_ = run(job);
    report_.blocked_s = blocked_s;
    finished_ = true;
  });
}

std::optional<SaveReport> CheckpointWriter::wait() {
  if (!thread_.joinable()) return std::nullopt;
  thread_.join();
  return report_;
}

TensorMap snapshot(const TensorMap& from, TensorMap& buffers) {
  TensorMap out;
  at::NoGradGuard ng;
  for (const auto& [key, t] : from) {
    at::Tensor& b = buffers[key];
    if (!b.defined() || b.sizes() != t.sizes() || b.scalar_type() != t.scalar_type())
      b = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(t.is_cuda()));
    b.copy_(t.detach());
    out[key] = b;
  }
  return out;
}

}  // namespace vidit
