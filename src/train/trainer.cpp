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

#include "diffusion/frame_condition.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/malloc_tuning.h"
#include "core/gpu_events.h"
#include "core/peak_flops.h"
#include "core/precision.h"
#include "core/storage.h"
#include "diagnose/forensics.h"
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
#include "checkpoint/checkpoint.h"
#include "train/run_control.h"
#include "train/run_weights.h"
#include "train/step_faults.h"
#include "train/step_windows.h"

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
      stragglers_(cfg.train.straggler_threshold, cfg.train.straggler_patience),
      spikes_(SpikeOptions{cfg.train.spike_bins, cfg.train.spike_z, cfg.train.spike_warmup}) {
  data_ = with_step_faults(data_, cfg.faults, faults_, step_);  // [faults] of the step: train/step_faults.h
  // Rank 0's record of the run, kept for its life (train/metric_sinks.h); the others' go nowhere.
  if (is_lead()) {
    sinks_.keep(std::make_unique<EventsFileSink>(cfg.train.out_dir));
    sinks_.keep(std::make_unique<SavesFileSink>(cfg.train.out_dir, cfg.checkpoint.async, console_));
    events_ = std::make_unique<EventLog>([this](const nlohmann::json& line) { sinks_.event(line); });
  } else {
    events_ = std::make_unique<EventLog>();
  }
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
  install_step_faults(*pm_->model(), cfg.faults, faults_, step_);
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
  // Saves and resumes. The host buffers saves copy the state into are allocated and touched now
  // (checkpoint.snapshots): the first save pauses no longer than later ones, and the memory is
  // taken before the first step.
  const auto& cc = cfg.checkpoint;
  ckpt_ = std::make_unique<Checkpointer>(
      CheckpointOptions{cfg.train.out_dir, cc.keep, cc.keep_every, cc.async, cc.snapshots, cc.timeout_s,
                        cc.failures_max},
      mesh_, *pm_, hosts_, faults_, [this]() -> EventLog& { return events(); });
  ckpt_->on_committed = [this](const SaveOutcome& o) { sinks_.saved(o); };
  ckpt_->reserve(*this);
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

void Trainer::set_validator(std::unique_ptr<Validator> v) { validator_ = std::move(v); }

// The live weights on the validation set (train/validation.h), in eval mode and without
// gradients, as sampling runs them; the result goes to rank 0's sinks.
ValidationMetrics Trainer::validate() {
  VIDIT_CHECK(validator_ != nullptr, "Trainer::validate: no validation set (data.val_fraction or data.val_cache)");
  watchdog_->beat("validating", step_, /*adaptive=*/false);
  ValidationMetrics v;
  {
    torch::NoGradGuard no_grad;
    pm_->after_forward_only();
    pm_->model()->eval();
    try {
      v = validator_->run(pm_->model(), *mesh_, step_);
    } catch (...) {
      pm_->after_forward_only();
      pm_->model()->train();
      throw;
    }
    pm_->after_forward_only();
    pm_->model()->train();
  }
  if (fp8_casts_) fp8_casts_->clear();  // the casts made for the evaluation are not kept
  watchdog_->beat("training", step_);
  if (v.clips == 0) {
    if (is_lead())
      std::fprintf(stderr, "warning: validation at step %lld: no held-out clip of %s could be read (see above); "
                           "training goes on\n", (long long)step_, validator_->set().cache->dir().c_str());
    return v;
  }
  if (is_lead()) sinks_.validation(v);
  return v;
}

EventLog& Trainer::events() { return *events_; }

void Trainer::check_replicas_or_stop() {
  if (cfg_.train.replica_check_every <= 0) return;
  const TensorMap optimizer = opt_->state();
  const ReplicaVerdict v = check_replicas(*mesh_, {&pm_->params(), &optimizer}, hosts_, step_);
  if (v.consistent) return;
  events().write("replicas_diverged", step_, {{"suspects", v.suspects}, {"groups", v.detail}});
  // The saves in flight hold states that passed this check when they began: they are committed
  // first (every rank agreed on the verdict, so every rank comes here), then the run stops.
  finish_save();
  throw ReplicasDiverged(v.message, is_lead());
}

std::string Trainer::save() {
  start_save();
  return finish_save();
}

void Trainer::start_save() {
  ckpt_->make_room();
  check_replicas_or_stop();  // replicas that disagree are never saved
  watchdog_->beat("saving a checkpoint", step_, /*adaptive=*/false);
  ckpt_->start_save(*this);
}

CheckpointState Trainer::checkpoint_state() {
  CheckpointState s;
  s.step = step_;
  s.model = pm_->params();
  if (ema_) s.ema = ema_->weights(), s.ema_updates = ema_->updates();
  s.optimizer = opt_->state();
  s.optimizer["rng/train"] = gen_.get_state();
  // The spike baselines (the same on every rank: they learn from gathered samples).
  for (const auto& [name, values] : spikes_.state())
    s.optimizer["spikes/" + name] = at::tensor(values, at::kDouble);
  // Ranks with batches of their own also have streams of their own: every one is saved.
  if (!data_->slices_global_batch()) {
    const auto& dp = mesh_->group("dp");
    at::Tensor own = gen_.get_state().to(at::kInt);
    at::Tensor all = at::empty({dp->size() * own.numel()}, own.options());
    dp->all_gather(own, all)->wait();
    for (int r = 1; r < dp->size(); ++r)
      s.optimizer["rng/train.dp" + std::to_string(r)] = all.narrow(0, r * own.numel(), own.numel()).to(at::kByte);
  }
  s.sampler = data_->state();
  s.config_toml = config_to_toml(cfg_);
  return s;
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
       "parallel.shard (more ranks share the state), checkpoint.snapshots"},
      {"a training step", device_.is_cpu() ? plan.step_peak() : plan.runtime + plan.snapshots,
       "parallel.shard, train.batch_size, train.memory_budget_gb (recompute), checkpoint.snapshots"},
      {"resume", device_.is_cpu() ? plan.resume_peak() : plan.runtime + plan.snapshots + plan.resume,
       "parallel.shard, checkpoint.snapshots"},
      {"samples while training", device_.is_cpu() ? plan.samples_peak() : plan.runtime + plan.snapshots,
       "sample.every, parallel.shard, checkpoint.snapshots"}};
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

std::string Trainer::finish_save() { return ckpt_->finish_all(); }

void Trainer::load(const std::string& dir) { ckpt_->load(dir, *this); }

bool Trainer::resume() { return ckpt_->resume(*this); }

std::unique_ptr<StagedState> Trainer::stage(const CheckpointReader& ckpt) const {
  // One whole tensor at a time: read from the mapped files, verified, cut to this rank's part
  // and copied out, so that resuming a large model at any mesh needs no more memory than one
  // whole tensor beyond a copy of this rank's state.
  const std::string& dir = ckpt.dir();
  const CheckpointState& meta = ckpt.meta();
  auto mine = [&](const char* what, const std::string& key) {
    watchdog_->beat("loading a checkpoint", -1, /*adaptive=*/false);
    // ckpt.whole() is a fresh copy and local() cuts a fresh part of it: no third copy.
    return pm_->local(key, ckpt.whole(what, key)).to(at::kCPU);
  };
  auto staged = std::make_unique<Staged>();
  Staged& s = *staged;
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
  // The data position is one in the list of clips that train: with another validation split it
  // continues over another list, and clips held out now may have trained before.
  if (!meta.config_toml.empty()) {
    const DataConfig saved = parse_config(meta.config_toml, dir + "/meta.json").data;
    if (saved.val_fraction != cfg_.data.val_fraction || saved.val_cache != cfg_.data.val_cache)
      s.split_changed = "data.val_fraction " + std::to_string(saved.val_fraction) + ", data.val_cache '" +
                        saved.val_cache + "'";
  }
  return staged;
}

void Trainer::apply(std::unique_ptr<StagedState> staged) {
  Staged& s = static_cast<Staged&>(*staged);
  if (!s.split_changed.empty() && is_lead())
    std::fprintf(stderr, "warning: %s was saved with another validation split (%s; now data.val_fraction %g, "
                 "data.val_cache '%s'): the data position continues over another list of clips, and clips held out "
                 "now may have trained before; their validation figure is not a held-out one\n", s.dir.c_str(),
                 s.split_changed.c_str(), cfg_.data.val_fraction, cfg_.data.val_cache.c_str());
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
  const auto& m = cfg_.model;
  MicroBatch b{at::zeros({1, m.out_channels, d.latent_frames, d.latent_height, d.latent_width}), at::Tensor(),
               null_text_.unsqueeze(0).to(at::kFloat), 0, 0, {}};
  if (appends_condition(m))
    b.condition = at::zeros({1, m.in_channels - m.out_channels, d.latent_frames, d.latent_height, d.latent_width});
  if (appends_condition(m) && m.image_dim > 0)
    b.image = at::zeros({1, m.image_pos_tokens > 0 ? m.image_pos_tokens : 1, m.image_dim});
  return b;
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
  // A run from step 0 may write step 0 (the validation baseline); a resumed one writes after its
  // step and after whatever the files already hold.
  o.first_step = after_rollback ? step_ + 1 : std::max(step_ > 0 ? step_ : -1, last_step_written(dir)) + 1;
  tb_ = std::make_unique<TensorBoardWriter>(dir, o);
  if (step_ == 0) tb_->add_text("config", 1, "```toml\n" + config_to_toml(cfg_) + "```");
}

// fit() on one screen; what it calls is below it, in the order it calls them.
std::vector<double> Trainer::fit(int64_t until_step, bool console, const StepHook& after_step) {
  console_ = console;
  const int64_t until = until_step < 0 ? cfg_.train.steps : std::min(until_step, cfg_.train.steps);
  open_sinks(/*after_rollback=*/false);
  watch_heartbeats();
  StepWindows windows(step_, cfg_.train.trace_steps, cfg_.train.profile_steps, cfg_.train.out_dir, mesh_->rank(),
                      device_.is_cuda(), console && is_lead());
  const int64_t first_step = step_;
  std::vector<double> losses, step_times;
  BucketLosses since_log;  // this rank's micro-batches by bucket since the last logged step
  if (validator_ && step_ == 0 && until > 0) validate();  // the start's figure, the baseline (collective)
  while (step_ < until) {
    windows.before_step(step_);
    const StepResult r = step();
    losses.push_back(r.loss);
    VIDIT_CHECK(std::isfinite(r.loss) || r.skipped, "training diverged at step ", r.step, ": loss is ", r.loss,
                "; lower train.lr or raise train.warmup_steps");
    report_skipped(r);
    for (const auto& [bucket, sum] : r.bucket_losses)
      since_log[bucket].first += sum.first, since_log[bucket].second += sum.second;
    if (r.step % cfg_.train.log_every == 0 || r.step == until) log_step(r, since_log);  // collective
    if (r.skipped || r.spike) sinks_.health(r.step, r.skipped, r.loss_z);
    windows.after_step(step_);
    pace_watchdog(r, first_step, step_times);
    if (validator_ && validator_->due(r.step)) validate();  // collective
    if (after_step) {
      watchdog_->beat("evaluating", step_, /*adaptive=*/false);
      after_step(r);
      watchdog_->beat("training", step_);
    }
    if (faults_.process_fault_after(r.step) && ckpt_->in_flight() > 0) finish_save();  // the same on all ranks
    faults_.after_step(r.step, pm_->params());  // the step is done and logged
    if (cfg_.train.replica_check_every > 0 && r.step % cfg_.train.replica_check_every == 0) check_replicas_or_stop();
    // What every rank does next, agreed in one collective (train/run_control.h).
    const AfterStepDecision next = agree_after_step(*mesh_->world(), after_step_view(r));
    if (next.roll_back && roll_back(r.step)) {  // back to the newest good checkpoint (spike_response.cpp)
      open_sinks(/*after_rollback=*/true);
      continue;
    }
    if (ckpt_->in_flight() > 0 && next.saves_written) finish_save();  // committed and reported at once
    if (next.stop) {
      stop_for_signal();
      break;
    }
    const bool step_due = cfg_.checkpoint.every > 0 && r.step % cfg_.checkpoint.every == 0;
    if ((step_due || next.save_due) && r.step != until) {
      if (tb_) tb_->flush();  // what a checkpoint holds is in the event file: a restart leaves no gap
      start_save();
    }
  }
  windows.finish();
  save();  // the run ends with its state committed
  summarize_communication();
  if (tb_) tb_->flush();
  return losses;
}

// Rank 0's sinks (train/metric_sinks.h): metrics.jsonl and the console line, and TensorBoard.
// A start from step 0 over an earlier attempt's metrics (one that died before its first
// checkpoint) keeps them beside the new file rather than overwriting them; a resumed run, or a
// rollback, continues the file from its step.
void Trainer::open_sinks(bool after_rollback) {
  if (!is_lead()) return;
  std::filesystem::create_directories(cfg_.train.out_dir);
  const std::string metrics = cfg_.train.out_dir + "/metrics.jsonl";
  std::error_code ec;
  if (!after_rollback && step_ == 0 && std::filesystem::file_size(metrics, ec) > 0 && !ec) {
    const std::string kept = metrics + ".before-" + std::to_string(std::time(nullptr));
    std::filesystem::rename(metrics, kept, ec);
    if (!ec && console_) std::printf("starting from step 0: the earlier %s is kept as %s\n", metrics.c_str(), kept.c_str());
  }
  std::vector<std::unique_ptr<MetricSink>> opened;
  opened.push_back(std::make_unique<MetricsFileSink>(
      std::make_unique<MetricsLogger>(metrics, /*append=*/step_ > 0 || after_rollback, console_, step_)));
  sinks_.open_steps({});  // the TensorBoard sink lets go of the writer open_tensorboard replaces
  open_tensorboard(after_rollback);
  if (tb_) opened.push_back(std::make_unique<TensorBoardSink>(*tb_));
  sinks_.open_steps(std::move(opened));
}

// Heartbeats for the watchdog's report of a hang: which ranks did not arrive.
void Trainer::watch_heartbeats() {
  std::shared_ptr<const Mesh> mesh = mesh_;
  std::function<void(const std::string&)> on_stall;
  if (is_lead()) on_stall = [this](const std::string& report) { events().write("hang", step_, {{"report", report}}); };
  watchdog_->report_to(cfg_.train.out_dir + "/heartbeats", mesh_->size(), [mesh] { return mesh->collectives_issued(); },
                       [mesh] { return mesh->blocked_s(); }, std::move(on_stall));
}

void Trainer::report_skipped(const StepResult& r) {
  if (!r.skipped) return;
  if (is_lead() && console_ && !r.spike)
    std::printf("step %lld: the gradient norm is not finite (%g); the update was skipped (%lld in a row)\n",
                (long long)r.step, r.grad_norm, (long long)skipped_in_a_row_);
  events().write("skipped_update", r.step, {{"why", r.spike ? "spike" : "non-finite gradient norm"},
                                            {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json(nullptr)},
                                            {"in_a_row", skipped_in_a_row_}});
}

// A logged step: its metrics (the slowest rank found by a collective, so every rank comes here on
// the same steps), handed to rank 0's sinks.
void Trainer::log_step(const StepResult& r, BucketLosses& since_log) {
  LoggedStep l;
  StepMetrics& m = l.metrics;
  m.step = r.step, m.total_steps = cfg_.train.steps, m.loss = r.loss, m.grad_norm = r.grad_norm, m.lr = r.lr;
  m.step_seconds = r.seconds, m.samples_per_s = double(r.samples) / r.seconds;
  m.tokens_per_s = double(r.tokens) / r.seconds, m.tflops = r.flops / r.seconds / 1e12;
  m.comm_wait_s = mesh_->world()->backend() == "single" ? -1 : r.comm_wait_s;  // alone: nothing to wait for
  m.data_wait_s = r.data_wait_s;
  if (peak_tflops_ > 0) m.mfu = m.tflops / (peak_tflops_ * mesh_->size());
  find_slowest(r, m);  // collective
  if (sinks_.has_step_sinks()) {
    l.sample_losses = r.sample_losses;
    for (const auto& [bucket, sum] : since_log) l.loss_by_bucket[bucket] = sum.first / double(sum.second);
    l.host_heap_gib = double(host_heap_bytes()) / double(1ll << 30);
    if (device_.is_cuda()) {
      const int gpu = std::max<int>(0, device_.index());
      l.device_peak_gib = double(cuda_peak_allocated_bytes(gpu)) / double(1ll << 30);
      cuda_reset_peak_memory(gpu);
    }
    sinks_.step(l);
  }
  since_log.clear();
}

// The watchdog's step-based limit follows the median step (the run's first step, with its
// allocations, left out).
void Trainer::pace_watchdog(const StepResult& r, int64_t first_step, std::vector<double>& step_times) {
  if (r.step <= first_step + 1) return;
  step_times.push_back(r.seconds);
  std::vector<double> recent(step_times.end() - std::min<ptrdiff_t>(ptrdiff_t(step_times.size()), 50), step_times.end());
  std::nth_element(recent.begin(), recent.begin() + ptrdiff_t(recent.size() / 2), recent.end());
  watchdog_->expect_step_s(recent[recent.size() / 2]);
}

// This rank's view for the agreement after a step: a stop asked for by a signal
// (resilience/stop_signal.h), a save due by rank 0's clock (checkpoint.every_minutes), whether
// a save is still being written here, and whether the step's spike asks for a rollback.
AfterStepView Trainer::after_step_view(const StepResult& r) const {
  const double minutes = cfg_.checkpoint.every_minutes;
  return {stop_requested(), is_lead() && minutes > 0 && ckpt_->seconds_since_save() >= minutes * 60, ckpt_->writing(),
          r.rollback};
}

void Trainer::stop_for_signal() {
  stopped_ = true;
  if (is_lead())
    std::printf("stop requested (signal %d%s) after step %lld: saving a checkpoint and exiting\n", stop_signal(),
                stop_signal() ? "" : " on another rank", (long long)step_);
}

}  // namespace vidit
