// The trainer: owns the model, AdamW, EMA, the data sampler and the RNG, and runs optimizer steps
// (train_step.cpp), logging and checkpointing. Deterministic for a seed: on the CPU a run resumed
// from a checkpoint reproduces the uninterrupted run bit for bit.
//
// Distributed: given a Mesh, the model is made data parallel over its "dp" group
// (dist/data_parallel.h). train.batch_size is then the global batch: each dp rank trains on its
// slice, draws the same noise and timesteps for its samples as a single process would, and the
// averaged gradients make every rank take the same step, so N ranks reproduce the single-process
// run (to fp32 rounding). With ulysses / ring degrees the model's tokens are also split over the
// "sp" group (dist/sequence_parallel.h) and the gradient shares summed there. Logged numbers are
// global; only rank 0 writes checkpoints, metrics and console lines. With parallel.shard > 1 the
// parameters, gradients, AdamW state and EMA are sharded (dist/fsdp.h): model() then holds no
// weights between steps, and checkpoints are written in parts by the shards' members (and, under
// tensor parallel, the tensor group's), put together on load, so they load at any mesh. With
// parallel.tensor > 1 each block's heads and MLP units are split over the "tensor" group first
// (dist/tensor_parallel.h); the reductions and FSDP then act on each member's parts.
//
// Every step reports the time this rank spent blocked in collectives (dist/timed_comm.h); each
// logged step also names the rank that computed longest (a slow node), and
// train.trace_steps > 0 writes a Chrome trace of that many steps, from the second step of the
// run, to <out_dir>/trace/rank<R>.json (core/trace.h).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/config.h"
#include "data/batch_source.h"
#include "data/dataset.h"
#include "dist/data_parallel.h"
#include "dist/fsdp.h"
#include "dist/mesh.h"
#include "dist/tensor_parallel.h"
#include "model/dit.h"
#include "model/model_info.h"
#include "train/adamw.h"
#include "train/ema.h"
#include "train/metrics.h"

namespace vidit {

struct StepResult {
  int64_t step = 0;       // steps completed after this one
  int64_t samples = 0;    // samples in this step (all micro-batches)
  int64_t tokens = 0;     // video tokens in this step
  double flops = 0;       // training FLOPs of this step (model_info.h accounting)
  double loss = 0;        // mean over the micro-batches
  double grad_norm = 0;   // before clipping
  double lr = 0;
  double seconds = 0;
  double comm_wait_s = -1;  // distributed: time this rank was blocked in collectives (-1: one process)
  double data_wait_s = 0;   // time spent waiting for the data source's batches
};

class Trainer {
 public:
  // `null_text` [Lt, text_dim]: the embedding used when the caption is dropped (CFG).
  // Reads `data` through an EpochSampler (fixed-shape samples).
  // `mesh`: the processes of a distributed run (nullptr: a single process). Construction is then
  // collective over the mesh (parameters are broadcast from rank 0).
  Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text,
          at::Device device = at::kCPU, std::shared_ptr<const Mesh> mesh = nullptr);
  // Reads any batch source, e.g. the latent cache's bucketed loader (variable shapes). Under data
  // parallel the source gives this rank's batches (EpochBatchSource / CacheLoader with the dp
  // rank and degree).
  Trainer(const Config& cfg, std::shared_ptr<BatchSource> source, at::Tensor null_text,
          at::Device device = at::kCPU, std::shared_ptr<const Mesh> mesh = nullptr);

  // Loads the newest checkpoint under cfg.train.out_dir; returns false when there is none.
  bool resume();
  // Loads a specific checkpoint directory.
  void load(const std::string& checkpoint_dir);
  // One optimizer step (grad_accum micro-batches). See train_step.cpp.
  StepResult step();
  // Steps until `until_step` (default: cfg.train.steps), logging every log_every steps,
  // checkpointing every ckpt_every steps and at the end. Returns each step's loss.
  // `after_step`, when given, runs after every step (e.g. a periodic evaluation).
  using StepHook = std::function<void(const StepResult&)>;
  std::vector<double> fit(int64_t until_step = -1, bool console = true, const StepHook& after_step = {});
  // Writes a checkpoint now (rank 0 only; other ranks write nothing); returns its directory.
  std::string save();
  // Rank 0 of the mesh, or a single process: the one that writes.
  bool is_lead() const { return !mesh_ || mesh_->rank() == 0; }

  int64_t steps_done() const { return step_; }
  DiT& model() { return model_; }
  EMA* ema() { return ema_.get(); }
  const FullyShardedDataParallel* fsdp() const { return fsdp_.get(); }
  // Whole weights by name, raw and EMA (collective over the mesh when they are sharded).
  TensorMap weights() const { return whole(params_); }
  TensorMap ema_weights() const { return ema_ ? whole(ema_->weights()) : TensorMap{}; }
  const Config& config() const { return cfg_; }

 private:
  Config cfg_;
  std::shared_ptr<BatchSource> data_;
  at::Tensor null_text_;
  at::Device device_;
  DiT model_{nullptr};
  TensorMap params_;
  std::vector<at::Tensor> param_list_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<EMA> ema_;
  at::Generator gen_;  // timesteps, noise, caption dropout
  ModelInfo info_;
  double sample_flops(const at::Tensor& latents);  // per sample of this shape
  // Data parallel: this rank's weight in the gradient average, B x dp / (samples of all dp ranks
  // in this micro-batch); -1 when no rank has a sample. Batches that are slices of a global one
  // know the total; others all-reduce their sizes (8 bytes).
  double batch_share(const MicroBatch& mb) const;
  // What an idle rank computes (with weight 0): its last batch, or zeros before it has one.
  MicroBatch stand_in() const;
  // Distributed: fills m's slowest rank and median busy time (all-gather of one double).
  void find_slowest(const StepResult& r, StepMetrics& m) const;
  MicroBatch last_batch_;
  int64_t step_ = 0;
  double peak_tflops_ = 0;  // per device, for MFU (0: unknown)
  std::shared_ptr<const Mesh> mesh_;
  std::unique_ptr<DataParallel> dp_;  // null in a single process and under FSDP
  std::unique_ptr<FullyShardedDataParallel> fsdp_;  // parallel.shard > 1
  std::unique_ptr<TensorParallel> tp_;               // parallel.tensor > 1
  // Checkpoint tensors: whole ones from what this member holds, and back (identity in one
  // process and under plain data parallel).
  TensorMap whole(const TensorMap& m) const;
  TensorMap local(const TensorMap& m) const;
};

}  // namespace vidit
