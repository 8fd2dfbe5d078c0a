#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/malloc_tuning.h"
#include "core/gpu_events.h"
#include "core/peak_flops.h"
#include "core/precision.h"
#include "core/storage.h"
#include "core/trace.h"
#include "diagnose/forensics.h"
#include "diagnose/profile.h"
#include "diagnose/health.h"
#include "diagnose/rank_hosts.h"
#include "diagnose/replica_check.h"
#include "parallel/activation_memory.h"
#include "parallel/parallelize.h"
#include "parallel/plan.h"
#include "resilience/stop_signal.h"
#include "model/attention_backend.h"
#include "model/fp8.h"
#include "model/lora.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "train/checkpoint.h"
#include "train/run_weights.h"

namespace vidit {

namespace {
// A run without a mesh is this process alone.
std::shared_ptr<const Mesh> own_mesh(const Config& cfg, std::shared_ptr<const Mesh> mesh) {
  return mesh ? mesh : std::make_shared<Mesh>(cfg, make_single_comm());
}
}  // namespace

Trainer::Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text,
                 at::Device device, std::shared_ptr<const Mesh> mesh)
    : Trainer(cfg, std::move(data), std::move(null_text), device, own_mesh(cfg, std::move(mesh)), nullptr) {}

Trainer::Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text, at::Device device,
                 std::shared_ptr<const Mesh> mesh, std::nullptr_t)
    : Trainer(cfg, std::make_shared<EpochBatchSource>(std::move(data), cfg.train.seed, mesh->coord("dp"), mesh->degree("dp")),
              std::move(null_text), device, mesh) {}

// One line from rank 0 on where the weights came from.
static void report_init(const InitWeights& w, bool parts, bool lead) {
  if (!lead) return;
  if (w.files.empty()) {
    std::printf("train.init_from: %s\n", w.from.c_str());
    return;
  }
  std::printf("train.init_from: %s (%.1f MiB mapped%s)\n", w.from.c_str(), double(w.file_bytes()) / double(1 << 20),
              parts ? "; each rank copies out and reads only its part of each tensor" : "");
}

// Ranks whose batches are their own (not slices of a global batch) draw from their own stream.
static uint64_t noise_seed(const Config& cfg, const BatchSource& source, const Mesh& mesh) {
  return cfg.train.seed + 1 + (source.slices_global_batch() ? 0 : 1000003ull * uint64_t(mesh.coord("dp")));
}

Trainer::Trainer(const Config& cfg, std::shared_ptr<BatchSource> source, at::Tensor null_text, at::Device device,
                 std::shared_ptr<const Mesh> mesh)
    : cfg_(cfg),
      data_(std::move(source)),
      null_text_(std::move(null_text)),
      device_(device),
      mesh_(own_mesh(cfg, std::move(mesh))),
      gen_(at::make_generator<at::CPUGeneratorImpl>(noise_seed(cfg, *data_, *mesh_))),
      info_(model_info(cfg)),
      faults_(cfg.faults, mesh_->rank()),
      watchdog_(std::make_unique<Watchdog>(cfg.train.stall_timeout_s, mesh_->rank(), cfg.train.stall_steps,
                                           cfg.train.stall_min_s)),
      last_save_time_(std::chrono::steady_clock::now()),
      stragglers_(cfg.train.straggler_threshold, cfg.train.straggler_patience),
      spikes_(SpikeOptions{cfg.train.spike_bins, cfg.train.spike_z, cfg.train.spike_warmup}) {
  if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
  if (device_.is_cuda() && device_.has_index()) use_gpu(device_.index());
  hosts_ = gather_hosts(*mesh_->world());
  check_memory_plan();
  torch::manual_seed(cfg.train.seed);  // LoRA's adapters draw from it
  // Build, parallelize, then allocate: the model is described on its device without memory
  // (model/param_storage.h); parallelize() cuts it, and then each rank allocates and fills only
  // its part (init_parts, or its part of train.init_from). No rank ever holds the whole model,
  // except a LoRA run's frozen base, which data parallel keeps whole on every rank anyway: it is
  // initialised (or loaded) whole here, one tensor at a time, before the adapters are added.
  DiT model = dit_without_storage(cfg.model, device_);
  std::optional<InitWeights> init;
  if (!cfg.train.init_from.empty()) init = open_init_weights(cfg);
  if (cfg.lora.rank > 0) {
    if (init) {
      load_state_dict(*model, init->weights, init->from);
      report_init(*init, /*parts=*/false, is_lead());
      init.reset();
    } else {
      model->init_weights(uint64_t(cfg.train.seed));
    }
  }
  // Numerics the model is told of (not parallelisms): FP8 projections, the attention kernel.
  // Reused casts: each weight's for the step only where the rank holds its weights whole
  // (FSDP's shards have their e4m3 copies gathered, or are freed between uses).
  if (cfg.train.fp8_reuse_casts && uses_fp8(cfg.train.precision))
    fp8_casts_ = std::make_shared<Fp8Casts>(/*weights=*/cfg.parallel.shard <= 1);
  const int64_t fp8_layers = apply_fp8(*model, cfg.train.precision, cfg.train.fp8_fast_accum, fp8_casts_);
  // LoRA: adapters beside the frozen projections, and the only parameters the run trains.
  TensorMap adapters;
  if (cfg.lora.rank > 0) {
    VIDIT_CHECK(cfg.lora.dropout == 0 || (cfg.train.recompute_blocks == 0 && cfg.train.memory_budget_gb == 0),
                "lora.dropout > 0 with activation recompute (train.recompute_blocks / train.memory_budget_gb): a "
                "recomputed block would draw other dropout masks than its forward did; set one of them to 0");
    adapters = apply_lora(*model, cfg.lora);
    if (is_lead()) {
      int64_t n = 0, base = 0;
      for (const auto& [name, t] : adapters) n += t.numel();
      for (const auto& p : model->parameters()) base += p.numel();
      std::printf("LoRA: rank %lld, scale %g, %zu projections adapted (%lld trained parameters, %.3f%% of the "
                  "%lld frozen ones)%s\n",
                  (long long)cfg.lora.rank, lora_scale(cfg.lora), adapters.size() / 2, (long long)n,
                  100.0 * double(n) / double(std::max<int64_t>(1, base)), (long long)base,
                  cfg.train.init_from.empty() ? "; train.init_from is empty: the base is a random init" : "");
    }
  }
  select_attention_backend(cfg.train.attention_backend, device_);
  {
    const ParallelConfig& p = cfg.parallel;
    const int64_t heads = std::max<int64_t>(1, cfg.model.heads / (p.tensor * p.ulysses));
    const std::string kernel = attention_backend_for(
        1, heads, std::max<int64_t>(1, info_.tokens / p.ring), cfg.model.dim / cfg.model.heads,
        autocasts_bf16(cfg.train.precision) ? at::kBFloat16 : at::kFloat, device_);
    if (is_lead()) {
      std::printf("attention: %s kernel (train.attention_backend = %s)\n", kernel.c_str(),
                  name_of(cfg.train.attention_backend).c_str());
      if (fp8_layers > 0)
        std::printf("precision %s: %lld projections in the blocks multiply in FP8; the embeddings, the head and "
                    "narrow projections in bf16 (model/fp8.h)\n",
                    name_of(cfg.train.precision).c_str(), (long long)fp8_layers);
    }
  }
  // The memory budget's choice of recomputation, from what a block holds on this device (every
  // rank measures; the largest figures are taken, so all ranks choose alike).
  std::optional<BlockActivations> activations;
  if (cfg.train.memory_budget_gb > 0) {
    activations = measure_block_activations(cfg, device_);
    at::Tensor v = at::tensor({activations->keep.per_token, activations->keep.per_sample, activations->selective.per_token,
                               activations->selective.per_sample, activations->whole.per_token, activations->whole.per_sample},
                              at::kDouble);
    mesh_->world()->all_reduce(v, ReduceOp::Max)->wait();
    int i = 0;
    for (auto* l : {&activations->keep, &activations->selective, &activations->whole})
      l->per_token = v[i++].item<double>(), l->per_sample = v[i++].item<double>();
    if (is_lead()) {
      const StepPlan plan = plan_step(cfg, &*activations);
      std::printf("activation checkpointing for train.memory_budget_gb = %g: %lld blocks recomputed whole, %lld "
                  "selectively, %lld keep their activations (vidit plan: ~%.2f GiB per rank; a block holds %.1f KiB "
                  "per token, %s)\n",
                  cfg.train.memory_budget_gb, (long long)plan.recompute.whole, (long long)plan.recompute.selective,
                  (long long)(cfg.model.layers - plan.recompute.whole - plan.recompute.selective),
                  plan.memory() / double(1ll << 30), activations->keep.per_token / 1024, activations->source.c_str());
    }
  }
  peak_tflops_ = cfg.train.peak_tflops > 0 ? cfg.train.peak_tflops
                 : device_.is_cuda()       ? peak_tflops(cuda_device_name(std::max<int>(0, device_.index())), cfg.train.precision)
                                           : 0;
  // Every parallelism of the mesh, in one place; params() are what this rank updates.
  pm_ = parallelize(std::move(model), mesh_, cfg, activations ? &*activations : nullptr, std::move(adapters));
  if (init) {
    load_init_parts(*pm_, *init);
    report_init(*init, /*parts=*/cfg.parallel.shard > 1 || cfg.parallel.tensor > 1, is_lead());
    init.reset();
  } else if (cfg.lora.rank == 0) {
    pm_->init_parts(uint64_t(cfg.train.seed));
  }
  opt_ = std::make_unique<AdamW>(pm_->params(), AdamWOptions{cfg.train.beta1, cfg.train.beta2, cfg.train.adam_eps,
                                                            cfg.train.weight_decay},
                                 pm_->whole_shapes());
  if (cfg.train.ema_decay > 0) ema_ = std::make_unique<EMA>(pm_->params(), cfg.train.ema_decay);
  // The host buffers saves copy the state into, allocated and touched now (train.ckpt_snapshots):
  // the first save pauses no longer than later ones, and the memory is taken before the first step.
  snapshot_bytes_ = reserve_snapshots();
  // What earlier attempts of this run quarantined is never handed out again.
  quarantine_ = std::make_unique<Quarantine>(cfg.train.out_dir, cfg.train.quarantine_after);
  data_->skip(quarantine_->quarantined());
  lr_scale_ = std::pow(cfg.train.rollback_lr_scale, double(quarantine_->rollbacks()));
}

TensorMap Trainer::sampling_weights() const {
  TensorMap w = ema_ ? ema_weights() : weights();
  if (cfg_.lora.rank == 0) return w;
  return merge_lora(lora_base_weights(*pm_->model()), w, lora_scale(cfg_.lora));
}

void Trainer::with_sampling_weights(const std::function<void(DiT&)>& fn) {
  torch::NoGradGuard no_grad;
  pm_->after_forward_only();  // nothing gathered from the live weights may serve the first pass
  TensorMap live;
  if (ema_)
    for (const auto& [name, p] : pm_->params()) live[name] = p.clone(), p.copy_(ema_->weights().at(name));
  auto restore = [&] {
    pm_->after_forward_only();
    for (const auto& [name, p] : live) pm_->params().at(name).copy_(p);
    pm_->model()->train();
  };
  pm_->model()->eval();
  try {
    fn(pm_->model());
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

EventLog& Trainer::events() {
  if (!events_) events_ = std::make_unique<EventLog>(is_lead() ? cfg_.train.out_dir : "");
  return *events_;
}

void Trainer::check_replicas_or_stop() {
  if (cfg_.train.replica_check_every <= 0) return;
  const TensorMap optimizer = opt_->state();
  const ReplicaVerdict v = check_replicas(*mesh_, {&pm_->params(), &optimizer}, hosts_, step_);
  if (v.consistent) return;
  events().write("replicas_diverged", step_, {{"suspects", v.suspects}, {"groups", v.detail}});
  throw ReplicasDiverged(v.message, is_lead());
}

std::string Trainer::save() {
  start_save();
  return finish_save();
}

void Trainer::start_save() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& tc = cfg_.train;
  // Two saves may be in flight: one being written and this one, snapshotted into the other set
  // of host buffers and written after it. A third waits for the oldest (and all ranks agree on
  // it) first. Replicas that disagree are never saved.
  // (A synchronous save's report is told first.)
  const int64_t sets = tc.ckpt_snapshots;
  if (sync_report_ || writer_.in_flight() >= std::max<int64_t>(1, sets)) finish_oldest_save();
  check_replicas_or_stop();
  watchdog_->beat("saving a checkpoint", step_, /*adaptive=*/false);
  SaveJob job;
  job.out_dir = tc.out_dir;
  CheckpointState& s = job.state;
  s.step = step_;
  s.layouts = pm_->layouts();
  s.part = pm_->part();
  job.write = writes_part();
  job.commit = is_lead();
  job.rank = mesh_->rank();
  job.with_ema = ema_ != nullptr;
  job.keep = tc.keep_checkpoints, job.keep_every = tc.keep_every, job.timeout_s = tc.ckpt_timeout_s;
  job.storage = &faults_.storage_for_save(step_, local_storage());
  // Each rank keeps the keys it writes: its part of a parameter when it is that part's writer,
  // and (rank 0) the keys that name no parameter.
  auto mine = [&](const TensorMap& m) { return written_part(m); };
  const TensorMap model = mine(pm_->params());
  const TensorMap ema = ema_ ? mine(ema_->weights()) : TensorMap{};
  if (ema_) s.ema_updates = ema_->updates();
  TensorMap optimizer = opt_->state();
  optimizer["rng/train"] = gen_.get_state();
  // The spike baselines (the same on every rank: they learn from gathered samples).
  for (const auto& [name, values] : spikes_.state())
    optimizer["spikes/" + name] = at::tensor(values, at::kDouble);
  // Ranks with batches of their own also have streams of their own: every one is saved.
  if (!data_->slices_global_batch()) {
    const auto& dp = mesh_->group("dp");
    at::Tensor own = gen_.get_state().to(at::kInt);
    at::Tensor all = at::empty({dp->size() * own.numel()}, own.options());
    dp->all_gather(own, all)->wait();
    for (int r = 1; r < dp->size(); ++r)
      optimizer["rng/train.dp" + std::to_string(r)] = all.narrow(0, r * own.numel(), own.numel()).to(at::kByte);
  }
  optimizer = mine(optimizer);
  s.sampler = data_->state();
  s.config_toml = config_to_toml(cfg_);
  // Rank 0 opens the directory (removing what a killed save left) before any part is written.
  // (Not the one of the save still being written.)
  if (is_lead()) begin_checkpoint(tc.out_dir, step_, local_storage(), writer_.steps());
  mesh_->world()->barrier();
  // The state as it is now, in host buffers kept from one save to the next.
  // (train.ckpt_snapshots = 0: no buffers; the live state is written before training goes on.)
  if (job.write && sets == 0) {
    s.model = model, s.ema = ema, s.optimizer = optimizer;
  } else if (job.write) {
    Snapshots& into = snaps_[snap_slot_];
    snap_slot_ = (snap_slot_ + 1) % int(sets);
    s.model = snapshot(model, into.model);
    s.ema = snapshot(ema, into.ema);
    s.optimizer = snapshot(optimizer, into.optimizer);
  }
  const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  last_save_time_ = std::chrono::steady_clock::now();
  if (tc.ckpt_async && sets > 0) {
    writer_.start(std::move(job), blocked);
  } else {
    SaveReport r = CheckpointWriter::run(job);
    r.blocked_s = blocked + r.write_s;
    sync_report_ = r;
  }
}

void Trainer::check_memory_plan() const {
  // Host memory of this node: its ranks x each one's peak phase (vidit plan). On a GPU the host
  // holds the runtime, the snapshot buffers and a resume's staged copy; on the CPU everything.
  const StepPlan plan = plan_step(cfg_);
  struct Phase {
    const char* name;
    double bytes;
    const char* keys;
  };
  const Phase phases[] = {
      {"construction", device_.is_cpu() ? plan.construction_peak() : plan.runtime + plan.snapshots,
       "parallel.shard (more ranks share the state), train.ckpt_snapshots"},
      {"a training step", device_.is_cpu() ? plan.step_peak() : plan.runtime + plan.snapshots,
       "parallel.shard, train.batch_size, train.memory_budget_gb (recompute), train.ckpt_snapshots"},
      {"resume", device_.is_cpu() ? plan.resume_peak() : plan.runtime + plan.snapshots + plan.resume,
       "parallel.shard, train.ckpt_snapshots"},
      {"samples while training", device_.is_cpu() ? plan.samples_peak() : plan.runtime + plan.snapshots,
       "sample.every, parallel.shard, train.ckpt_snapshots"}};
  const Phase* worst = &phases[0];
  for (const Phase& p : phases)
    if (p.bytes > worst->bytes) worst = &p;
  const int64_t here = std::count(hosts_.begin(), hosts_.end(), hosts_[size_t(mesh_->rank())]);
  const double need = double(here) * worst->bytes;
  const double have = cfg_.train.host_memory_gb > 0 ? cfg_.train.host_memory_gb * 1e9 : double(host_total_bytes());
  VIDIT_CHECK(have <= 0 || need <= have, "the run does not fit this node's memory: ", here, " ranks on ",
              hosts_[size_t(mesh_->rank())], " each need ", worst->bytes / double(1 << 30), " GiB at ", worst->name,
              " (vidit plan), ", need / double(1 << 30), " GiB in all, against ", have / double(1 << 30),
              " GiB (", cfg_.train.host_memory_gb > 0 ? "train.host_memory_gb" : "MemTotal",
              "). Change ", worst->keys, ", or run fewer ranks per node");
}

void Trainer::agreed_unreadable(CheckpointUnreadable e) const {
  // Every rank reached this after the same all-gather: each prints, then all wait for one
  // another, so that a rank ending the job (abort_world) cannot cut off another's message.
  std::fprintf(stderr, "error: %s\n", e.what());
  std::fflush(stderr);
  mesh_->world()->barrier();
  e.reported = true;
  throw e;
}

TensorMap Trainer::written_part(const TensorMap& m) const {
  TensorMap out;
  for (const auto& [key, t] : m)
    if (pm_->writes(key)) out[key] = t;
  return out;
}

bool Trainer::writes_part() const {
  const CheckpointPart part = pm_->part();
  return std::all_of(std::begin(kMeshDims), std::end(kMeshDims), [&](const char* d) {
    return std::find(part.dims.begin(), part.dims.end(), d) != part.dims.end() || mesh_->coord(d) == 0;
  });
}

int64_t Trainer::reserve_snapshots() {
  if (!writes_part() || cfg_.train.ckpt_snapshots == 0) return 0;
  auto mine = [&](const TensorMap& m) { return written_part(m); };
  const TensorMap model = mine(pm_->params()), ema = ema_ ? mine(ema_->weights()) : TensorMap{},
                  optimizer = mine(opt_->state());
  int64_t bytes = 0;
  for (int64_t k = 0; k < cfg_.train.ckpt_snapshots; ++k)
    bytes += reserve_snapshot(model, snaps_[k].model) + reserve_snapshot(ema, snaps_[k].ema) +
             reserve_snapshot(optimizer, snaps_[k].optimizer);
  return bytes;
}

std::string Trainer::finish_save() {
  // Every save in flight, oldest first; a synchronous save's report, or nothing.
  std::string dir = finish_oldest_save();
  while (writer_.in_flight() > 0) dir = finish_oldest_save();
  return dir;
}

std::string Trainer::finish_oldest_save() {
  std::optional<SaveReport> done = writer_.in_flight() ? writer_.wait() : std::move(sync_report_);
  sync_report_.reset();
  // Collective: every rank calls this at the same points, with or without a save in flight.
  // Column 1: 0 fine, 1 the commit failed, 2 this rank's own part failed (named first).
  const double failure = !done || done->error.empty() ? 0.0 : done->in_commit ? 1.0 : 2.0;
  at::Tensor mine = at::tensor({done ? 1.0 : 0.0, failure,
                                done ? double(done->bytes) : 0.0, done ? done->write_s : 0.0},
                               at::kDouble);
  at::Tensor all = at::empty({mesh_->size() * 4}, at::kDouble);
  mesh_->world()->all_gather(mine, all)->wait();
  all = all.view({mesh_->size(), 4});
  if (all.select(1, 0).max().item<double>() == 0) return "";  // nothing was in flight
  const bool failed = all.select(1, 1).max().item<double>() > 0;
  const int64_t step = done ? done->step : step_;
  if (failed) {
    ++failed_saves_;
    const int bad_rank = int(all.select(1, 1).argmax().item<int64_t>());
    if (is_lead()) {
      const auto good = latest_checkpoint(cfg_.train.out_dir);
      std::fprintf(stderr,
                   "checkpoint of step %lld was not saved (failed on rank %d%s%s); the newest good checkpoint is %s. "
                   "%s\n",
                   (long long)step, bad_rank, done->error.empty() ? "" : ": ", done->error.c_str(),
                   good ? good->c_str() : "none",
                   failed_saves_ < cfg_.train.ckpt_failures_max ? "Training goes on; the next save tries again"
                                                                 : "");
    } else if (done && !done->error.empty()) {
      std::fprintf(stderr, "rank %d: its part of the checkpoint of step %lld failed: %s\n", mesh_->rank(),
                   (long long)step, done->error.c_str());
    }
    events().write("save_failed", step, {{"rank", bad_rank}, {"host", bad_rank < int(hosts_.size()) ? hosts_[size_t(bad_rank)] : ""},
                                         {"error", done ? done->error : ""}, {"in_a_row", failed_saves_}});
    VIDIT_CHECK(failed_saves_ < cfg_.train.ckpt_failures_max, failed_saves_,
                " saves in a row failed (train.ckpt_failures_max); stopping. Fix the storage of ", cfg_.train.out_dir,
                " and run the same command again: it resumes from the newest good checkpoint");
    return "";
  }
  failed_saves_ = 0;
  if (!is_lead()) {
    faults_.after_save(step, "");
    return "";
  }
  const double bytes = all.select(1, 2).sum().item<double>(), write_s = all.select(1, 3).max().item<double>();
  if (console_) {
    std::printf("checkpoint step %lld: training paused %.3f s, written in %.2f s in the background "
                "(%.1f MB by %d rank(s), %.0f MB/s) -> %s\n",
                (long long)step, done->blocked_s, write_s, bytes / 1e6, int((all.select(1, 2) > 0).sum().item<int64_t>()),
                write_s > 0 ? bytes / 1e6 / write_s : 0.0, done->dir.c_str());
    if (tb_) {
      tb_->add_scalar("checkpoint/pause_s", step, done->blocked_s);
      tb_->add_scalar("checkpoint/write_s", step, write_s);
    }
    std::ofstream log(cfg_.train.out_dir + "/saves.jsonl", std::ios::app);
    log << nlohmann::json{{"step", step},          {"blocked_s", done->blocked_s}, {"write_s", write_s},
                          {"bytes", int64_t(bytes)}, {"async", cfg_.train.ckpt_async}, {"dir", done->dir}}
               .dump()
        << "\n";
  }
  faults_.after_save(step, done->dir);
  return done->dir;
}

void Trainer::load(const std::string& dir) { apply(read_checkpoint(dir, local_storage())); }

Trainer::Staged Trainer::read_checkpoint(const std::string& dir, Storage& storage) const {
  // One whole tensor at a time: read from the mapped files, verified, cut to this rank's part
  // and copied out, so that resuming a large model at any mesh needs no more memory than one
  // whole tensor beyond a copy of this rank's state. The whole tensors and the parts get their own
  // mappings (core/malloc_tuning.h): freed wholes leave no holes for the heap to keep.
  ScopedFreshMappings fresh_mappings;
  CheckpointReader ckpt(dir, storage);
  const CheckpointState& meta = ckpt.meta();
  auto mine = [&](const char* what, const std::string& key) {
    watchdog_->beat("loading a checkpoint", -1, /*adaptive=*/false);
    // ckpt.whole() is a fresh copy and local() cuts a fresh part of it: no third copy.
    return pm_->local(key, ckpt.whole(what, key)).to(at::kCPU);
  };
  Staged s;
  s.dir = dir;
  s.step = meta.step;
  // Every parameter, by name and whole shape, before anything is read.
  check_state_dict(pm_->whole_shapes(), ckpt.shapes("model"), dir + "/model.safetensors");
  for (const auto& [name, p] : pm_->params()) s.model[name] = mine("model", name);
  if (ema_) {
    VIDIT_CHECK(ckpt.has("ema"), "checkpoint '", dir, "' has no EMA weights but train.ema_decay > 0");
    const TensorMap saved = ckpt.shapes("ema");
    for (const auto& [name, t] : ema_->weights()) {
      VIDIT_CHECK(saved.count(name), "checkpoint '", dir, "/ema.safetensors' lacks '", name, "'");
      s.ema[name] = mine("ema", name);
    }
    s.ema_updates = meta.ema_updates;
  }
  for (const std::string& key : ckpt.keys("optimizer")) s.optimizer[key] = mine("optimizer", key);
  opt_->check_state(s.optimizer, dir + "/optimizer.safetensors");
  auto rng = s.optimizer.find("rng/train");
  VIDIT_CHECK(rng != s.optimizer.end(), "checkpoint '", dir, "' has no RNG state (rng/train)");
  const int dp_rank = mesh_->coord("dp");
  if (data_->slices_global_batch() || dp_rank == 0) {
    s.rng = rng->second;  // one stream for all ranks, or rank 0's own
  } else {
    auto own = s.optimizer.find("rng/train.dp" + std::to_string(dp_rank));
    if (own != s.optimizer.end()) s.rng = own->second;  // else: a rank the saving run did not have
  }
  if (s.rng.defined()) {
    // A state the generator refuses is refused here, before anything changed.
    at::Generator probe = at::make_generator<at::CPUGeneratorImpl>(0);
    probe.set_state(s.rng);
  }
  for (const auto& [key, t] : s.optimizer)
    if (key.rfind("spikes/", 0) == 0) {
      at::Tensor v = t.to(at::kDouble).contiguous();
      s.spikes[key.substr(7)] = std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
    }
  s.sampler = meta.sampler;
  return s;
}

void Trainer::apply(Staged&& s) {
  at::NoGradGuard ng;
  for (const auto& [name, p] : pm_->params()) at::Tensor(p).copy_(s.model.at(name));
  if (ema_) {
    for (auto& [name, t] : ema_->weights()) t.copy_(s.ema.at(name));
    ema_->set_updates(s.ema_updates);
  }
  opt_->load_state(s.optimizer, s.dir + "/optimizer.safetensors");
  if (s.rng.defined())
    gen_.set_state(s.rng);
  else  // a stream of its own from (seed, rank, step)
    gen_ = at::make_generator<at::CPUGeneratorImpl>(noise_seed(cfg_, *data_, *mesh_) + 7919ull * uint64_t(s.step));
  // Older checkpoints, or another train.spike_bins: the baselines warm up again.
  if (!spikes_.set_state(s.spikes)) {
    spikes_ = SpikeDetector(SpikeOptions{cfg_.train.spike_bins, cfg_.train.spike_z, cfg_.train.spike_warmup});
    if (is_lead() && console_)
      std::fprintf(stderr, "%s has no spike baselines for train.spike_bins = %lld: they warm up again "
                           "(train.spike_warmup)\n", s.dir.c_str(), (long long)cfg_.train.spike_bins);
  }
  data_->set_state(s.sampler);
  step_ = s.step;
}

double Trainer::sample_flops(const at::Tensor& x) {
  if (x.size(2) == cfg_.data.latent_frames && x.size(3) == cfg_.data.latent_height && x.size(4) == cfg_.data.latent_width)
    return info_.train_flops;
  Config c = cfg_;
  c.data.latent_frames = x.size(2), c.data.latent_height = x.size(3), c.data.latent_width = x.size(4);
  return model_info(c).train_flops;
}

void Trainer::find_slowest(const StepResult& r, StepMetrics& m) {
  // Busy: on a GPU as its stream measured it, on the CPU the step less the time blocked.
  at::Tensor mine =
      at::tensor({r.device_busy_s >= 0 ? r.device_busy_s : r.seconds - std::max(0.0, r.comm_wait_s)}, at::kDouble);
  at::Tensor all = at::empty({mesh_->size()}, at::kDouble);
  mesh_->world()->all_gather(mine, all)->wait();
  const std::vector<double> busy(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  const std::vector<StragglerChange> changes = stragglers_.observe(busy);
  m.slowest_rank = int(all.argmax().item<int64_t>());
  m.slowest_busy_s = all.max().item<double>();
  m.median_busy_s = all.median().item<double>();
  m.slowest_host = hosts_.at(size_t(m.slowest_rank));
  m.slowest_score = stragglers_.scores().at(size_t(m.slowest_rank)).relative;
  if (!is_lead()) return;
  // A straggler that stays one for train.straggler_exclude_steps logged steps: its host goes to
  // the exclude list, for the next allocation (this run goes on).
  const int64_t exclude_at = cfg_.train.straggler_exclude_steps;
  for (int rank = 0; rank < mesh_->size() && exclude_at > 0; ++rank) {
    if (stragglers_.below(rank) != exclude_at) continue;
    const std::string host = hosts_.at(size_t(rank)), list = exclude_list_path(cfg_.train);
    add_to_exclude_list(list, {host});
    std::fprintf(stderr, "straggler: %s has been one for %lld logged steps (train.straggler_exclude_steps): its host is "
                         "added to %s; start the next allocation without it (srun / sbatch --exclude)\n",
                 rank_and_host(rank, hosts_).c_str(), (long long)exclude_at, list.c_str());
    events().write("excluded", r.step, {{"host", host}, {"rank", rank}, {"why", "straggler for " + std::to_string(exclude_at) + " logged steps"}});
  }
  for (const StragglerChange& c : changes) {
    const std::string who = rank_and_host(c.rank, hosts_);
    if (c.straggling) {
      std::fprintf(stderr,
                   "straggler: %s has computed %.2fx as long as the median rank for %lld logged steps (score %.2f < "
                   "train.straggler_threshold %.2f; %.3f s against %.3f s; its own best %.3f s): every rank waits "
                   "for it at each collective. Check that host (vidit health) or exclude it\n",
                   who.c_str(), c.score.busy_s / std::max(c.median_busy_s, 1e-9), (long long)c.steps, c.score.relative,
                   cfg_.train.straggler_threshold, c.score.busy_s, c.median_busy_s,
                   c.score.busy_s * c.score.individual);
    } else {
      std::fprintf(stderr, "straggler: %s is back to speed (score %.2f)\n", who.c_str(), c.score.relative);
    }
    events().write(c.straggling ? "straggler" : "straggler_recovered", r.step,
                   {{"rank", c.rank}, {"host", hosts_.at(size_t(c.rank))}, {"score", c.score.relative},
                    {"individual_score", c.score.individual}, {"busy_s", c.score.busy_s},
                    {"median_busy_s", c.median_busy_s}});
  }
}

double Trainer::batch_share(const MicroBatch& mb) const {
  const auto& dp = mesh_->group("dp");
  const double mine = double(mb.latents.size(0));
  double total = double(mb.global_rows);
  if (!data_->slices_global_batch()) {
    at::Tensor n = at::tensor({mine}, at::kDouble);
    dp->all_reduce(n, ReduceOp::Sum)->wait();
    total = n.item<double>();
  }
  if (total <= 0) return -1;
  return mine * dp->size() / total;
}

MicroBatch Trainer::stand_in() const {
  if (last_batch_.latents.defined()) return last_batch_;
  const auto& d = cfg_.data;
  return {at::zeros({1, cfg_.model.in_channels, d.latent_frames, d.latent_height, d.latent_width}), at::Tensor(),
          null_text_.unsqueeze(0).to(at::kFloat), 0, 0, {}};
}

bool Trainer::resume() {
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
  const std::vector<std::string> candidates = checkpoint_candidates(cfg_.train.out_dir);
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
    std::optional<Staged> staged;
    const int64_t step = std::stoll(std::filesystem::path(dir).filename().string().substr(5));
    try {
      staged = read_checkpoint(dir, faults_.storage_for_load(step, local_storage()));
    } catch (const CheckpointCorrupt& e) {
      status = 1, why = e.what(), file = e.file();
    } catch (const CheckpointUnreadable& e) {
      status = 3, why = e.what();
    } catch (const Error& e) {
      status = 2, why = e.what();
    } catch (const std::exception& e) {
      status = 4, why = e.what();
    }
    if (status != 0 && !is_lead()) std::fprintf(stderr, "rank %d: checkpoint %s: %s\n", mesh_->rank(), dir.c_str(), why.c_str());
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
      apply(std::move(*staged));
      if (is_lead())
        for (const auto& [bad, bad_why] : corrupt) {
          std::fprintf(stderr, "checkpoint %s is corrupt: %s\n  set aside as %s\n", bad.c_str(), bad_why.c_str(),
                       set_aside_checkpoint(bad, dir, cfg_.train.keep_checkpoints).c_str());
          events().write("checkpoint_set_aside", step_, {{"dir", bad}, {"why", bad_why}});
        }
      if (!corrupt.empty() && is_lead())
        std::fprintf(stderr, "resuming from %s instead (step %lld)\n", dir.c_str(), (long long)step_);
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
    if (is_lead()) std::fprintf(stderr, "checkpoint %s cannot be used: %s\n", dir.c_str(), why.c_str());
    corrupt.emplace_back(dir, why);
  }
  if (!corrupt.empty()) {
    std::string list;
    for (const auto& [d, w] : corrupt) list += "\n  " + d + ": " + w;
    fail("no checkpoint in ", cfg_.train.out_dir, "/checkpoints verifies:", list,
         "\nNothing was set aside: restore a good copy of one of them, or start from step 0 with --fresh (what is "
         "there is moved aside, not deleted)");
  }
  const std::vector<std::string> traces = traces_of_checkpoints(cfg_.train.out_dir);
  if (!traces.empty()) {
    std::string list;
    for (const auto& t : traces) list += "\n  " + t;
    fail("no checkpoint to resume from in ", cfg_.train.out_dir, "/checkpoints, but earlier ones are there:", list,
         "\nRefusing to start from step 0 over them: restore one (rename step_N.corrupt back to step_N if you know it "
         "is good), or start over with --fresh (what is there is moved aside, not deleted)");
  }
  return false;
}

// Rank 0's TensorBoard file (train.tensorboard): a new file each attempt. A resumed run writes only
// the steps no earlier file holds (those after its checkpoint that the stopped run logged are not
// written again); after a rollback the steps trained again are written again, in a new file, since
// they differ. The resolved config once, as text.
void Trainer::open_tensorboard(bool after_rollback) {
  if (!cfg_.train.tensorboard || !is_lead()) return;
  tb_.reset();  // flushes the previous file first
  const std::string dir = cfg_.train.out_dir + "/tb";
  TensorBoardOptions o;
  o.first_step = after_rollback ? step_ + 1 : std::max(step_, last_step_written(dir)) + 1;
  tb_ = std::make_unique<TensorBoardWriter>(dir, o);
  if (step_ == 0) tb_->add_text("config", 1, "```toml\n" + config_to_toml(cfg_) + "```");
}

std::vector<double> Trainer::fit(int64_t until_step, bool console, const StepHook& after_step) {
  console_ = console;
  const int64_t total = cfg_.train.steps;
  const int64_t until = until_step < 0 ? total : std::min(until_step, total);
  std::unique_ptr<MetricsLogger> logger;
  if (is_lead()) {
    std::filesystem::create_directories(cfg_.train.out_dir);
    // A start from step 0 over an earlier attempt's metrics (one that died before its first
    // checkpoint) keeps them beside the new file rather than overwriting them.
    const std::string metrics = cfg_.train.out_dir + "/metrics.jsonl";
    std::error_code ec;
    if (step_ == 0 && std::filesystem::file_size(metrics, ec) > 0 && !ec) {
      const std::string kept = metrics + ".before-" + std::to_string(std::time(nullptr));
      std::filesystem::rename(metrics, kept, ec);
      if (!ec && console) std::printf("starting from step 0: the earlier %s is kept as %s\n", metrics.c_str(), kept.c_str());
    }
    logger = std::make_unique<MetricsLogger>(cfg_.train.out_dir + "/metrics.jsonl", /*append=*/step_ > 0, console, step_);
    open_tensorboard(false);
  }
  std::vector<double> losses;
  std::map<std::string, std::pair<double, int64_t>> bucket_losses;  // since the last log line
  // Heartbeats for the watchdog's report of a hang: which ranks did not arrive.
  {
    std::shared_ptr<const Mesh> mesh = mesh_;
    std::function<void(const std::string&)> on_stall;
    if (is_lead()) on_stall = [this](const std::string& report) { events().write("hang", step_, {{"report", report}}); };
    watchdog_->report_to(cfg_.train.out_dir + "/heartbeats", mesh_->size(), [mesh] { return mesh->collectives_issued(); },
                         [mesh] { return mesh->blocked_s(); }, std::move(on_stall));
  }
  std::vector<double> step_times;
  // The trace skips the run's first step (allocations, first gathers) and records the next ones.
  const int64_t trace_from = step_ + 1, trace_to = trace_from + cfg_.train.trace_steps;
  auto finish_trace = [&] {
    if (!trace::on()) return;
    trace::stop();
    const int rank = mesh_->rank();
    const std::string path = cfg_.train.out_dir + "/trace/rank" + std::to_string(rank) + ".json";
    const size_t n = trace::write(path);
    if (console && is_lead())
      std::printf("trace of steps %lld-%lld: %zu events in %s (one file per rank; open in ui.perfetto.dev)\n",
                  (long long)trace_from + 1, (long long)step_, n, path.c_str());
  };
  // LibTorch's profiler over train.profile_steps steps, the first left out too (diagnose/profile.h).
  const int64_t profile_from = step_ + 1, profile_to = profile_from + cfg_.train.profile_steps;
  std::unique_ptr<KinetoProfile> profile;
  auto finish_profile = [&] {
    if (!profile) return;
    const std::string dir = cfg_.train.out_dir + "/profile", rank = std::to_string(mesh_->rank());
    const ProfileSummary s = profile->stop(dir + "/rank" + rank + ".json");
    profile.reset();
    std::ofstream(dir + "/summary_rank" + rank + ".json") << profile_summary_json(s, profile_from + 1, step_) << "\n";
    if (console && is_lead())
      std::printf("profile of steps %lld-%lld (rank 0, %.3f s): host %s%s%s; trace in %s/rank%s.json (one per rank; "
                  "ui.perfetto.dev)\n",
                  (long long)profile_from + 1, (long long)step_, s.window_s, s.format(false).c_str(),
                  s.has_device() ? "; GPU " : "", s.has_device() ? s.format(true).c_str() : "", dir.c_str(),
                  rank.c_str());
  };
  while (step_ < until) {
    if (cfg_.train.trace_steps > 0 && step_ == trace_from)
      trace::start(mesh_->rank(), "rank " + std::to_string(mesh_->rank()));
    if (cfg_.train.profile_steps > 0 && step_ == profile_from)
      profile = std::make_unique<KinetoProfile>(device_.is_cuda(), /*memory=*/true);
    StepResult r = step();
    losses.push_back(r.loss);
    VIDIT_CHECK(std::isfinite(r.loss) || r.skipped, "training diverged at step ", r.step, ": loss is ", r.loss,
                "; lower train.lr or raise train.warmup_steps");
    if (r.skipped && is_lead() && console && !r.spike)
      std::printf("step %lld: the gradient norm is not finite (%g); the update was skipped (%lld in a row)\n",
                  (long long)r.step, r.grad_norm, (long long)skipped_in_a_row_);
    if (r.skipped)
      events().write("skipped_update", r.step, {{"why", r.spike ? "spike" : "non-finite gradient norm"},
                                                {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json(nullptr)},
                                                {"in_a_row", skipped_in_a_row_}});
    // spike_response.cpp: back to the newest good checkpoint, and on from there.
    if (r.rollback && roll_back(r.step)) {
      if (logger) logger = std::make_unique<MetricsLogger>(cfg_.train.out_dir + "/metrics.jsonl", true, console, step_);
      if (tb_) open_tensorboard(/*after_rollback=*/true);
      continue;
    }
    for (const auto& [bucket, sum] : r.bucket_losses) {
      auto& b = bucket_losses[bucket];
      b.first += sum.first, b.second += sum.second;
    }
    if (r.step % cfg_.train.log_every == 0 || r.step == until) {
      StepMetrics m;
      m.step = r.step, m.total_steps = total, m.loss = r.loss, m.grad_norm = r.grad_norm, m.lr = r.lr;
      m.step_seconds = r.seconds, m.samples_per_s = double(r.samples) / r.seconds;
      m.tokens_per_s = double(r.tokens) / r.seconds, m.tflops = r.flops / r.seconds / 1e12;
      m.comm_wait_s = mesh_->world()->backend() == "single" ? -1 : r.comm_wait_s;  // alone: nothing to wait for
      m.data_wait_s = r.data_wait_s;
      if (peak_tflops_ > 0) m.mfu = m.tflops / (peak_tflops_ * mesh_->size());
      find_slowest(r, m);  // collective: every rank logs the same steps
      if (logger) logger->log(m);
      if (tb_) {
        tb_->add_step_metrics(m);
        tb_->add_histogram("train/sample_loss", r.step, r.sample_losses);
        // Rank 0's micro-batches since the last log line, by bucket; the memory its tensors hold.
        for (const auto& [bucket, sum] : bucket_losses)
          tb_->add_scalar("train/loss_by_bucket/" + bucket, r.step, sum.first / double(sum.second));
        tb_->add_scalar("memory/host_heap_gib", r.step, double(host_heap_bytes()) / double(1ll << 30));
        if (device_.is_cuda()) {
          const int gpu = std::max<int>(0, device_.index());
          tb_->add_scalar("memory/device_peak_gib", r.step, double(cuda_peak_allocated_bytes(gpu)) / double(1ll << 30));
          cuda_reset_peak_memory(gpu);
        }
      }
      bucket_losses.clear();
    }
    if (tb_ && (r.skipped || r.spike)) {
      tb_->add_scalar("health/skipped_update", r.step, r.skipped ? 1 : 0);
      tb_->add_scalar("health/spike_loss_z", r.step, r.loss_z);
    }
    if (step_ == trace_to) finish_trace();
    if (step_ == profile_to) finish_profile();
    // The watchdog's step-based limit follows the median step (the run's first step, with its
    // allocations, left out).
    if (r.step > trace_from) {
      step_times.push_back(r.seconds);
      std::vector<double> recent(step_times.end() - std::min<ptrdiff_t>(ptrdiff_t(step_times.size()), 50), step_times.end());
      std::nth_element(recent.begin(), recent.begin() + ptrdiff_t(recent.size() / 2), recent.end());
      watchdog_->expect_step_s(recent[recent.size() / 2]);
    }
    if (after_step) {
      watchdog_->beat("evaluating", step_, /*adaptive=*/false);
      after_step(r);
      watchdog_->beat("training", step_);
    }
    if (faults_.process_fault_after(r.step) && writer_.in_flight() > 0) finish_save();  // the same on all ranks
    faults_.after_step(r.step, pm_->params());  // the step is done and logged
    if (cfg_.train.replica_check_every > 0 && r.step % cfg_.train.replica_check_every == 0) check_replicas_or_stop();
    // Agreed by all ranks after every step, in one collective: a stop asked for by a signal on
    // any rank (resilience/stop_signal.h: save below and return), and a save that is due, by
    // the step count or by rank 0's clock (train.ckpt_every_minutes).
    const double minutes = cfg_.train.ckpt_every_minutes;
    const bool time_due = is_lead() && minutes > 0 &&
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time_).count() >=
                              minutes * 60;
    // And whether a save is still being written on some rank: once none is, it is finished
    // (and reported) at once rather than at the next save.
    const bool writing = writer_.in_flight() > 0 && !writer_.finished();
    at::Tensor flags = at::tensor({stop_requested() ? 1.0 : 0.0, time_due ? 1.0 : 0.0, writing ? 1.0 : 0.0}, at::kDouble);
    mesh_->world()->all_reduce(flags, ReduceOp::Max)->wait();
    if (writer_.in_flight() > 0 && flags[2].item<double>() == 0) finish_save();
    if (flags[0].item<double>() > 0) {
      stopped_ = true;
      if (is_lead())
        std::printf("stop requested (signal %d%s) after step %lld: saving a checkpoint and exiting\n", stop_signal(),
                    stop_signal() ? "" : " on another rank", (long long)step_);
      break;
    }
    const bool step_due = cfg_.train.ckpt_every > 0 && r.step % cfg_.train.ckpt_every == 0;
    if ((step_due || flags[1].item<double>() > 0) && r.step != until) {
      if (tb_) tb_->flush();  // what a checkpoint holds is in the event file: a restart leaves no gap
      start_save();
    }
  }
  finish_trace();
  finish_profile();
  // The last save is waited for: the run ends with its state committed.
  save();
  summarize_communication();
  if (tb_) tb_->flush();
  return losses;
}

}  // namespace vidit
