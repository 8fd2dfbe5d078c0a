#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/peak_flops.h"
#include "core/trace.h"
#include "dist/sequence_parallel.h"
#include "model/state_dict.h"
#include "train/checkpoint.h"

namespace vidit {

Trainer::Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text,
                 at::Device device, std::shared_ptr<const Mesh> mesh)
    : Trainer(cfg,
              std::make_shared<EpochBatchSource>(std::move(data), cfg.train.seed, mesh ? mesh->coord("dp") : 0,
                                                 mesh ? mesh->degree("dp") : 1),
              std::move(null_text), device, mesh) {}

// Ranks whose batches are their own (not slices of a global batch) draw from their own stream.
static uint64_t noise_seed(const Config& cfg, const BatchSource& source, const Mesh* mesh) {
  const int dp_rank = mesh ? mesh->coord("dp") : 0;
  return cfg.train.seed + 1 + (source.slices_global_batch() ? 0 : 1000003ull * uint64_t(dp_rank));
}

Trainer::Trainer(const Config& cfg, std::shared_ptr<BatchSource> source, at::Tensor null_text, at::Device device,
                 std::shared_ptr<const Mesh> mesh)
    : cfg_(cfg),
      data_(std::move(source)),
      null_text_(std::move(null_text)),
      device_(device),
      gen_(at::make_generator<at::CPUGeneratorImpl>(noise_seed(cfg, *data_, mesh.get()))),
      info_(model_info(cfg)),
      mesh_(std::move(mesh)) {
  if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
  torch::manual_seed(cfg.train.seed);
  model_ = DiT(cfg.model);
  model_->init_weights();
  if (!cfg.train.init_from.empty())
    load_state_dict(*model_, read_weights(cfg.train.init_from), cfg.train.init_from);
  model_->to(device_);
  model_->recompute_blocks = cfg.train.recompute_blocks;
  peak_tflops_ = cfg.train.peak_tflops > 0 ? cfg.train.peak_tflops
                 : device_.is_cuda()       ? peak_tflops(cuda_device_name(std::max<int>(0, device_.index())), cfg.train.precision)
                                           : 0;
  for (auto& item : model_->named_parameters(true)) {
    params_[item.key()] = item.value();
    param_list_.push_back(item.value());
  }
  if (mesh_) {
    tp_ = apply_tensor_parallel(*model_, *mesh_);  // params_ now hold this member's parts
    apply_sequence_parallel(*model_, *mesh_);
    // Sharded (FSDP / HSDP) or replicated (DDP) parameters; with FSDP the optimizer and the EMA
    // hold shards.
    fsdp_ = apply_fsdp(*model_, *mesh_, cfg.parallel);
    if (fsdp_) {
      params_ = fsdp_->shards();
      param_list_.clear();
      for (auto& [name, p] : params_) param_list_.push_back(p);
    } else {
      dp_ = apply_data_parallel(param_list_, *mesh_, cfg.parallel);
    }
  }
  opt_ = std::make_unique<AdamW>(params_, AdamWOptions{cfg.train.beta1, cfg.train.beta2,
                                                       cfg.train.adam_eps, cfg.train.weight_decay},
                                 fsdp_ ? fsdp_->full_params() : TensorMap{});
  if (cfg.train.ema_decay > 0) ema_ = std::make_unique<EMA>(params_, cfg.train.ema_decay);
}

TensorMap Trainer::whole(const TensorMap& m) const {
  TensorMap parts = fsdp_ ? fsdp_->gather_full(m) : m;
  return tp_ ? tp_->gather_whole(parts) : parts;
}
TensorMap Trainer::local(const TensorMap& m) const {
  TensorMap parts = tp_ ? tp_->part_of(m) : m;
  return fsdp_ ? fsdp_->shard_of(parts) : parts;
}

std::string Trainer::save() {
  CheckpointState s;
  s.step = step_;
  s.model = params_;  // whole tensors, or under FSDP this member's shards
  if (ema_) s.ema = ema_->weights(), s.ema_updates = ema_->updates();
  s.optimizer = opt_->state();
  s.optimizer["rng/train"] = gen_.get_state();
  // Ranks with batches of their own also have streams of their own: every one is saved.
  if (mesh_ && !data_->slices_global_batch() && mesh_->degree("dp") > 1) {
    const auto& dp = mesh_->group("dp");
    at::Tensor mine = gen_.get_state().to(at::kInt);
    at::Tensor all = at::empty({dp->size() * mine.numel()}, mine.options());
    dp->all_gather(mine, all)->wait();
    for (int r = 0; r < dp->size(); ++r)
      s.optimizer["rng/train.dp" + std::to_string(r)] = all.narrow(0, r * mine.numel(), mine.numel()).to(at::kByte);
  }
  s.sampler = data_->state();
  s.config_toml = config_to_toml(cfg_);
  const auto& tc = cfg_.train;
  if (!fsdp_ && !tp_) return is_lead() ? save_checkpoint(tc.out_dir, s, tc.keep_checkpoints) : std::string();
  // Sharded (FSDP) or split (tensor parallel): each part is written once, by its member with
  // replicate and sp coordinates 0, between barriers, and rank 0 commits. Nothing is gathered.
  s.shards = mesh_->degree("shard");
  const TensorMap& parts = fsdp_ ? fsdp_->full_params() : params_;  // this member's parameter parts
  for (const auto& [name, p] : parts) s.shapes[name] = p.sizes().vec();
  if (tp_) {
    s.tensor = tp_->degree();
    for (const auto& [name, p] : parts)
      if (tp_->split_dim(name) >= 0) s.split[name] = tp_->split_dim(name);
  }
  if (is_lead()) begin_checkpoint(tc.out_dir, step_);
  mesh_->world()->barrier();
  if (mesh_->coord("replicate") == 0 && mesh_->coord("sp") == 0)
    write_checkpoint_shard(checkpoint_tmp_dir(tc.out_dir, step_), s, mesh_->coord("shard"), mesh_->coord("tensor"));
  mesh_->world()->barrier();
  return is_lead() ? commit_checkpoint(tc.out_dir, s, tc.keep_checkpoints) : std::string();
}

void Trainer::load(const std::string& dir) {
  // One whole tensor at a time: read from the mapped files, cut to this member's part (tensor
  // parallel) and shard (FSDP), and dropped, so that resuming a large model at any mesh needs
  // no more memory than one whole tensor beyond this member's state.
  CheckpointReader ckpt(dir);
  const CheckpointState& meta = ckpt.meta();
  auto mine = [&](const char* what, const std::string& key) { return local({{key, ckpt.whole(what, key)}}).at(key); };
  // Every parameter, by name and whole shape, before anything is read.
  check_state_dict(tp_ ? tp_->whole_params() : fsdp_ ? fsdp_->full_params() : params_, ckpt.shapes("model"),
                   dir + "/model.safetensors");
  at::NoGradGuard ng;
  for (auto& [name, p] : params_) p.copy_(mine("model", name));
  if (ema_) {
    VIDIT_CHECK(ckpt.has("ema"), "checkpoint '", dir, "' has no EMA weights but train.ema_decay > 0");
    const TensorMap saved = ckpt.shapes("ema");
    for (auto& [name, t] : ema_->weights()) {
      VIDIT_CHECK(saved.count(name), "checkpoint '", dir, "/ema.safetensors' lacks '", name, "'");
      t.copy_(mine("ema", name));
    }
    ema_->set_updates(meta.ema_updates);
  }
  TensorMap optimizer;
  for (const std::string& key : ckpt.keys("optimizer")) optimizer[key] = mine("optimizer", key);
  opt_->load_state(optimizer, dir + "/optimizer.safetensors");
  auto rng = optimizer.find("rng/train");
  VIDIT_CHECK(rng != optimizer.end(), "checkpoint '", dir, "' has no RNG state (rng/train)");
  const int dp_rank = mesh_ ? mesh_->coord("dp") : 0;
  if (data_->slices_global_batch() || dp_rank == 0) {
    gen_.set_state(rng->second);  // one stream for all ranks, or rank 0's own
  } else {
    auto own = optimizer.find("rng/train.dp" + std::to_string(dp_rank));
    if (own != optimizer.end())
      gen_.set_state(own->second);
    else  // a rank the saving run did not have: a stream of its own from (seed, rank, step)
      gen_ = at::make_generator<at::CPUGeneratorImpl>(noise_seed(cfg_, *data_, mesh_.get()) + 7919ull * uint64_t(meta.step));
  }
  data_->set_state(meta.sampler);
  step_ = meta.step;
}

double Trainer::sample_flops(const at::Tensor& x) {
  if (x.size(2) == cfg_.data.latent_frames && x.size(3) == cfg_.data.latent_height && x.size(4) == cfg_.data.latent_width)
    return info_.train_flops;
  Config c = cfg_;
  c.data.latent_frames = x.size(2), c.data.latent_height = x.size(3), c.data.latent_width = x.size(4);
  return model_info(c).train_flops;
}

void Trainer::find_slowest(const StepResult& r, StepMetrics& m) const {
  at::Tensor mine = at::tensor({r.seconds - std::max(0.0, r.comm_wait_s)}, at::kDouble);
  at::Tensor all = at::empty({mesh_->size()}, at::kDouble);
  mesh_->world()->all_gather(mine, all)->wait();
  m.slowest_rank = int(all.argmax().item<int64_t>());
  m.slowest_busy_s = all.max().item<double>();
  m.median_busy_s = all.median().item<double>();
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
          null_text_.unsqueeze(0).to(at::kFloat)};
}

bool Trainer::resume() {
  auto dir = latest_checkpoint(cfg_.train.out_dir);
  if (!dir) return false;
  load(*dir);
  return true;
}

std::vector<double> Trainer::fit(int64_t until_step, bool console, const StepHook& after_step) {
  const int64_t total = cfg_.train.steps;
  const int64_t until = until_step < 0 ? total : std::min(until_step, total);
  std::unique_ptr<MetricsLogger> logger;
  if (is_lead()) {
    std::filesystem::create_directories(cfg_.train.out_dir);
    logger = std::make_unique<MetricsLogger>(cfg_.train.out_dir + "/metrics.jsonl", /*append=*/step_ > 0, console);
  }
  std::vector<double> losses;
  // The trace skips the run's first step (allocations, first gathers) and records the next ones.
  const int64_t trace_from = step_ + 1, trace_to = trace_from + cfg_.train.trace_steps;
  auto finish_trace = [&] {
    if (!trace::on()) return;
    trace::stop();
    const int rank = mesh_ ? mesh_->rank() : 0;
    const std::string path = cfg_.train.out_dir + "/trace/rank" + std::to_string(rank) + ".json";
    const size_t n = trace::write(path);
    if (console && is_lead())
      std::printf("trace of steps %lld-%lld: %zu events in %s (one file per rank; open in ui.perfetto.dev)\n",
                  (long long)trace_from + 1, (long long)step_, n, path.c_str());
  };
  while (step_ < until) {
    if (cfg_.train.trace_steps > 0 && step_ == trace_from)
      trace::start(mesh_ ? mesh_->rank() : 0, "rank " + std::to_string(mesh_ ? mesh_->rank() : 0));
    StepResult r = step();
    losses.push_back(r.loss);
    VIDIT_CHECK(std::isfinite(r.loss), "training diverged at step ", r.step, ": loss is ", r.loss,
                "; lower train.lr or raise train.warmup_steps");
    if (r.step % cfg_.train.log_every == 0 || r.step == until) {
      StepMetrics m{r.step, total, r.loss, r.grad_norm, r.lr, r.seconds, double(r.samples) / r.seconds,
                    double(r.tokens) / r.seconds, r.flops / r.seconds / 1e12};
      m.comm_wait_s = r.comm_wait_s;
      m.data_wait_s = r.data_wait_s;
      if (peak_tflops_ > 0) m.mfu = m.tflops / (peak_tflops_ * (mesh_ ? mesh_->size() : 1));
      if (mesh_ && mesh_->size() > 1) find_slowest(r, m);  // collective: every rank logs the same steps
      if (logger) logger->log(m);
    }
    if (step_ == trace_to) finish_trace();
    if (cfg_.train.ckpt_every > 0 && r.step % cfg_.train.ckpt_every == 0 && r.step != until) save();
    if (after_step) after_step(r);
  }
  finish_trace();
  save();
  if (console && is_lead() && mesh_ && mesh_->size() > 1) {
    // Where rank 0 waited, over the whole run, by collective.
    const CommTimes times = mesh_->comm_times();
    std::printf("communication on rank 0 (time blocked in wait, calls, bytes handed over):\n");
    for (const auto& [op, e] : times.by_op)
      std::printf("  %-15s %9.3f s %9lld calls %12.1f MB\n", op.c_str(), e.wait_s, (long long)e.calls, e.bytes / 1e6);
  }
  return losses;
}

}  // namespace vidit
