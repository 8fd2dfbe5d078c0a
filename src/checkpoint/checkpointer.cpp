#include "checkpoint/checkpointer.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/malloc_tuning.h"
#include "core/storage.h"
#include "diagnose/events.h"
#include "diagnose/rank_hosts.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "resilience/fault_injection.h"

namespace vidit {

Checkpointer::Checkpointer(CheckpointOptions opt, std::shared_ptr<const Mesh> mesh, const ParallelModel& model,
                           std::vector<std::string> hosts, FaultInjector& faults, std::function<EventLog&()> events)
    : opt_(std::move(opt)),
      mesh_(std::move(mesh)),
      model_(model),
      hosts_(std::move(hosts)),
      faults_(faults),
      events_(std::move(events)),
      last_save_time_(std::chrono::steady_clock::now()) {}

Checkpointer::~Checkpointer() = default;

bool Checkpointer::lead() const { return mesh_->rank() == 0; }

bool Checkpointer::writes_part() const {
  const CheckpointPart part = model_.part();
  return std::all_of(std::begin(kMeshDims), std::end(kMeshDims), [&](const char* d) {
    return std::find(part.dims.begin(), part.dims.end(), d) != part.dims.end() || mesh_->coord(d) == 0;
  });
}

TensorMap Checkpointer::written_part(const TensorMap& m) const {
  TensorMap out;
  for (const auto& [key, t] : m)
    if (model_.writes(key)) out[key] = t;
  return out;
}

double Checkpointer::seconds_since_save() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time_).count();
}

int64_t Checkpointer::reserve(CheckpointedRun& run) {
  const CheckpointState s = run.checkpoint_state();  // (every rank: it may be collective)
  if (!writes_part() || opt_.snapshots == 0) return 0;
  const TensorMap model = written_part(s.model), ema = written_part(s.ema), optimizer = written_part(s.optimizer);
  int64_t bytes = 0;
  for (int64_t k = 0; k < std::min<int64_t>(opt_.snapshots, 2); ++k)
    bytes += reserve_snapshot(model, snaps_[k].model) + reserve_snapshot(ema, snaps_[k].ema) +
             reserve_snapshot(optimizer, snaps_[k].optimizer);
  snapshot_bytes_ = bytes;
  return bytes;
}

void Checkpointer::make_room() {
  // Two saves may be in flight: one being written and one snapshotted into the other set of
  // buffers, written after it. Another waits for the oldest first. (Training is paused from
  // here: the save's reported pause counts the wait.)
  room_from_ = std::chrono::steady_clock::now();
  if (sync_report_ || writer_.in_flight() >= std::max<int64_t>(1, opt_.snapshots)) finish_oldest();
}

void Checkpointer::start_save(CheckpointedRun& run) {
  const auto t0 = room_from_ ? *room_from_ : std::chrono::steady_clock::now();
  room_from_.reset();
  CheckpointState live = run.checkpoint_state();
  SaveJob job;
  job.out_dir = opt_.out_dir;
  job.write = writes_part();
  job.rank = mesh_->rank();
  job.with_ema = !live.ema.empty();
  job.storage = &faults_.storage_for_save(live.step, local_storage());
  CheckpointState& s = job.state;
  s.step = live.step, s.ema_updates = live.ema_updates, s.sampler = live.sampler, s.config_toml = live.config_toml;
  s.layouts = model_.layouts();
  s.part = model_.part();
  Pending pending{s, job.storage};  // (no tensors yet)
  // Each rank keeps the keys it writes: its part of a parameter when it is that part's writer,
  // and (rank 0) the keys that name no parameter.
  const TensorMap model = written_part(live.model), ema = written_part(live.ema),
                  optimizer = written_part(live.optimizer);
  // Rank 0 opens the directory (removing what a killed save left, but not the directories of
  // saves still being written) before any part is written.
  if (lead()) begin_checkpoint(opt_.out_dir, s.step, *job.storage, writer_.steps());
  mesh_->world()->barrier();
  // The state as it is now, in host buffers kept from one save to the next (no buffers: the
  // live state is written before training goes on).
  if (job.write && opt_.snapshots == 0) {
    s.model = model, s.ema = ema, s.optimizer = optimizer;
  } else if (job.write) {
    Snapshots& into = snaps_[snap_slot_];
    snap_slot_ = (snap_slot_ + 1) % int(std::min<int64_t>(opt_.snapshots, 2));
    s.model = snapshot(model, into.model);
    s.ema = snapshot(ema, into.ema);
    s.optimizer = snapshot(optimizer, into.optimizer);
  }
  const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  last_save_time_ = std::chrono::steady_clock::now();
  pending_.push_back(std::move(pending));
  if (opt_.async && opt_.snapshots > 0) {
    writer_.start(std::move(job), blocked);
  } else {
    SaveReport r = CheckpointWriter::run(job);
    r.blocked_s = blocked + r.write_s;
    sync_report_ = r;
    finish_oldest();  // committed before training goes on
  }
}

namespace {
// Every rank's `text`, in rank order, on every rank (two all-gathers: sizes, then the bytes
// padded to the longest).
std::vector<std::string> all_gather_text(Comm& comm, const std::string& text) {
  const int n = comm.size();
  at::Tensor size = at::tensor({int64_t(text.size())}, at::kLong);
  at::Tensor sizes = at::empty({n}, at::kLong);
  comm.all_gather(size, sizes)->wait();
  const int64_t longest = std::max<int64_t>(1, sizes.max().item<int64_t>());
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), text.data(), text.size());
  at::Tensor all = at::empty({n * longest}, at::kByte);
  comm.all_gather(mine, all)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest, size_t(sizes[r].item<int64_t>()));
  return out;
}
}  // namespace

std::optional<SaveOutcome> Checkpointer::finish_oldest() {
  std::optional<SaveReport> done = writer_.in_flight() ? writer_.wait(opt_.timeout_s) : std::move(sync_report_);
  sync_report_.reset();
  std::optional<Pending> pending;
  if (done) {
    pending = std::move(pending_.front());
    pending_.pop_front();
  }
  // (1) Every rank's outcome. Failure: 0 none, 1 this rank's write failed, 2 it did not end
  // within checkpoint.timeout_s (the writer gave up on it).
  const double failure = !done || done->error.empty() ? 0.0 : done->timed_out ? 2.0 : 1.0;
  at::Tensor mine = at::tensor({done ? 1.0 : 0.0, failure, done ? double(done->part.bytes()) : 0.0,
                                done ? done->write_s : 0.0},
                               at::kDouble);
  at::Tensor all = at::empty({mesh_->size() * 4}, at::kDouble);
  mesh_->world()->all_gather(mine, all)->wait();
  all = all.view({mesh_->size(), 4});
  if (all.select(1, 0).max().item<double>() == 0) return std::nullopt;  // nothing was in flight
  SaveOutcome out;
  out.step = done ? done->step : -1;
  out.blocked_s = done ? done->blocked_s : 0.0;
  out.bytes = all.select(1, 2).sum().item<double>();
  out.write_s = all.select(1, 3).max().item<double>();
  out.writers = int((all.select(1, 2) > 0).sum().item<int64_t>());
  const bool part_failed = all.select(1, 1).max().item<double>() > 0;
  std::string error = done ? done->error : "";
  int bad_rank = part_failed ? int(all.select(1, 1).argmax().item<int64_t>()) : 0;
  if (part_failed) error = all_gather_text(*mesh_->world(), error)[size_t(bad_rank)];  // its reason, everywhere
  if (!part_failed) {
    // (2) The parts' records to rank 0, which commits; (3) its result to every rank.
    const std::vector<std::string> texts = all_gather_text(*mesh_->world(), done ? done->part.to_json() : "");
    at::Tensor committed = at::zeros({1}, at::kDouble);
    if (lead()) {
      try {
        VIDIT_CHECK(pending, "rank 0 has no save in flight while another rank has");
        std::vector<PartRecord> parts;
        for (const std::string& t : texts)
          if (!t.empty()) parts.push_back(PartRecord::from_json(t));
        out.dir = commit_checkpoint(opt_.out_dir, pending->meta, parts, opt_.keep, opt_.keep_every, *pending->storage);
        committed.fill_(1);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    mesh_->world()->broadcast(committed, 0)->wait();
    out.committed = committed.item<double>() > 0;
  }
  if (!out.committed) {
    ++failed_saves_;
    last_dir_.clear();
    const bool timed_out = all.select(1, 1).max().item<double>() == 2;
    if (lead()) {
      const auto good = latest_checkpoint(opt_.out_dir);
      std::fprintf(stderr, "checkpoint of step %lld was not saved (%s%s%s); the newest good checkpoint is %s. %s\n",
                   (long long)out.step,
                   part_failed ? ("failed on " + rank_and_host(bad_rank, hosts_)).c_str() : "the commit failed",
                   error.empty() ? "" : ": ", error.c_str(), good ? good->c_str() : "none",
                   timed_out || failed_saves_ >= opt_.failures_max ? "" : "Training goes on; the next save tries again");
    } else if (done && !done->error.empty()) {
      std::fprintf(stderr, "rank %d: its part of the checkpoint of step %lld failed: %s\n", mesh_->rank(),
                   (long long)out.step, done->error.c_str());
    }
    events_().write("save_failed", out.step,
                    {{"rank", bad_rank}, {"host", bad_rank < int(hosts_.size()) ? hosts_[size_t(bad_rank)] : ""},
                     {"error", error}, {"in_a_row", failed_saves_}});
    VIDIT_CHECK(!timed_out, "a rank's checkpoint write did not end within checkpoint.timeout_s (",
                int64_t(opt_.timeout_s), " s): its storage hangs. Stopping; check the storage of ", opt_.out_dir,
                " and run the same command again: it resumes from the newest good checkpoint");
    VIDIT_CHECK(failed_saves_ < opt_.failures_max, failed_saves_,
                " saves in a row failed (checkpoint.failures_max); stopping. Fix the storage of ", opt_.out_dir,
                " and run the same command again: it resumes from the newest good checkpoint");
    return out;
  }
  failed_saves_ = 0;
  last_dir_ = out.dir;
  if (lead() && on_committed) on_committed(out);
  faults_.after_save(out.step, out.dir);
  return out;
}

std::string Checkpointer::finish_all() {
  do {
    if (!finish_oldest()) break;
  } while (in_flight() > 0);
  return std::exchange(last_dir_, "");
}

void Checkpointer::agreed_unreadable(CheckpointUnreadable e) const {
  // Every rank reached this after the same all-gather: each prints, then all wait for one
  // another, so that a rank ending the job (abort_world) cannot cut off another's message.
  std::fprintf(stderr, "error: %s\n", e.what());
  std::fflush(stderr);
  mesh_->world()->barrier();
  e.reported = true;
  throw e;
}

void Checkpointer::load(const std::string& dir, CheckpointedRun& run) {
  // The whole tensors and the parts get their own mappings (core/malloc_tuning.h): freed wholes
  // leave no holes for the heap to keep.
  ScopedFreshMappings fresh_mappings;
  CheckpointReader ckpt(dir, local_storage());
  run.apply(run.stage(ckpt));
}

bool Checkpointer::resume(CheckpointedRun& run) {
  // Newest first. A checkpoint is read and verified into fresh memory on every rank, then the
  // ranks compare outcomes, and only when every one of them verified the same step does it
  // replace the live state. Corrupt ones (every rank found the damage, in the same file) are
  // fallen back past. Anything else stops the resume with nothing changed on disk or in memory:
  // a checkpoint that does not fit this run (config), one a rank cannot read now (I/O,
  // permission, memory: CheckpointUnreadable, exit kUnreadableCheckpointStatus, so the same
  // command can try again), a newer format, a failure of another kind, ranks that disagree.
  // Corrupt checkpoints are set aside only once an older one has loaded: the last verified
  // checkpoint is never set aside for want of a second. A run whose out_dir shows earlier
  // checkpoints but has none to resume from refuses to start from step 0 (--fresh does).
  const std::vector<std::string> candidates = checkpoint_candidates(opt_.out_dir);
  const int n = mesh_->size();
  std::vector<std::pair<std::string, std::string>> corrupt;  // directory, why
  auto ranks_with = [&](const at::Tensor& all, int status) {
    std::string out;
    for (int r = 0; r < n; ++r)
      if (int(all[r][0].item<double>()) == status) out += (out.empty() ? "" : ", ") + rank_and_host(r, hosts_);
    return out;
  };
  for (const std::string& dir : candidates) {
    // This rank's outcome: 0 read and verified; 1 corrupt (in `file`); 2 does not fit this run;
    // 3 cannot be read now, or by this binary; 4 another failure.
    int status = 0;
    std::string why, file;
    std::unique_ptr<StagedState> staged;
    const int64_t step = std::stoll(std::filesystem::path(dir).filename().string().substr(5));
    try {
      ScopedFreshMappings fresh_mappings;
      CheckpointReader ckpt(dir, faults_.storage_for_load(step, local_storage()));
      staged = run.stage(ckpt);
    } catch (const CheckpointCorrupt& e) {
      status = 1, why = e.what(), file = e.file();
    } catch (const CheckpointUnreadable& e) {
      status = 3, why = e.what();
    } catch (const Error& e) {
      status = 2, why = e.what();
    } catch (const std::exception& e) {
      status = 4, why = e.what();
    }
    if (status != 0 && !lead()) std::fprintf(stderr, "rank %d: checkpoint %s: %s\n", mesh_->rank(), dir.c_str(), why.c_str());
    const double file_id = double(std::hash<std::string>{}(file) & ((uint64_t(1) << 52) - 1));
    at::Tensor mine = at::tensor({double(status), file_id, staged ? double(staged->step) : -1.0}, at::kDouble);
    at::Tensor all = at::empty({n * 3}, at::kDouble);
    mesh_->world()->all_gather(mine, all)->wait();
    all = all.view({n, 3});
    const at::Tensor st = all.select(1, 0);
    const std::string own = why.empty() ? "" : " (here: " + why + ")";
    VIDIT_CHECK(ranks_with(all, 2).empty(), "cannot resume from ", dir, ": it does not fit this run on ",
                ranks_with(all, 2), why.empty() ? "; see their message above" : ": " + why,
                ". Nothing was changed: fix the config to match it, or start this config in another train.out_dir");
    if (!ranks_with(all, 3).empty() || !ranks_with(all, 4).empty())
      agreed_unreadable(CheckpointUnreadable("checkpoint " + dir + " could not be read on " + ranks_with(all, 3) +
                                                 (ranks_with(all, 3).empty() || ranks_with(all, 4).empty() ? "" : ", and failed on ") +
                                                 ranks_with(all, 4) + own + ". That is no proof it is damaged: nothing was set aside " +
                                                 "or changed. Fix what the message says (storage, permissions, memory, the vidit " +
                                                 "version) and run the same command again",
                                             0));
    if (st.max().item<double>() == 0) {
      VIDIT_CHECK(all.select(1, 2).min().item<double>() == all.select(1, 2).max().item<double>(), "the ranks read ",
                  dir, " as different steps (", all.select(1, 2).min().item<double>(), " to ",
                  all.select(1, 2).max().item<double>(), "): is out_dir the same directory on every host?");
      const int64_t resumed = staged->step;
      run.apply(std::move(staged));
      if (lead())
        for (const auto& [bad, bad_why] : corrupt) {
          std::fprintf(stderr, "checkpoint %s is corrupt: %s\n  set aside as %s\n", bad.c_str(), bad_why.c_str(),
                       set_aside_checkpoint(bad, dir, opt_.keep).c_str());
          events_().write("checkpoint_set_aside", resumed, {{"dir", bad}, {"why", bad_why}});
        }
      if (!corrupt.empty() && lead())
        std::fprintf(stderr, "resuming from %s instead (step %lld)\n", dir.c_str(), (long long)resumed);
      mesh_->world()->barrier();
      return true;
    }
    // Corrupt only when every rank found it so, in the same file.
    const bool same_file = st.min().item<double>() == 1 &&
                           all.select(1, 1).min().item<double>() == all.select(1, 1).max().item<double>();
    if (!same_file)
      agreed_unreadable(CheckpointUnreadable("checkpoint " + dir + ": " + ranks_with(all, 1) + " found it corrupt" +
                                                 (ranks_with(all, 0).empty() ? " in different files" : " but " + ranks_with(all, 0) +
                                                                                                         " read it whole") +
                                                 own + ". The ranks disagree, which proves no damage (a host's storage or memory " +
                                                 "may be at fault): nothing was set aside or changed. Check those hosts (vidit health) " +
                                                 "and run the same command again",
                                             0));
    if (lead()) std::fprintf(stderr, "checkpoint %s cannot be used: %s\n", dir.c_str(), why.c_str());
    corrupt.emplace_back(dir, why);
  }
  if (!corrupt.empty()) {
    std::string list;
    for (const auto& [d, w] : corrupt) list += "\n  " + d + ": " + w;
    fail("no checkpoint in ", opt_.out_dir, "/checkpoints verifies:", list,
         "\nNothing was set aside: restore a good copy of one of them, or start from step 0 with --fresh (what is "
         "there is moved aside, not deleted)");
  }
  const std::vector<std::string> traces = traces_of_checkpoints(opt_.out_dir);
  if (!traces.empty()) {
    std::string list;
    for (const auto& t : traces) list += "\n  " + t;
    fail("no checkpoint to resume from in ", opt_.out_dir, "/checkpoints, but earlier ones are there:", list,
         "\nRefusing to start from step 0 over them: restore one (rename step_N.corrupt back to step_N if you know it "
         "is good), or start over with --fresh (what is there is moved aside, not deleted)");
  }
  return false;
}

}  // namespace vidit
