// The trainer: owns the model, AdamW, EMA, the data sampler and the RNG, and runs optimizer steps
// (train_step.cpp), logging and checkpointing. Deterministic for a seed: on the CPU a run resumed
// from a checkpoint reproduces the uninterrupted run bit for bit.
//
// Every run is on a mesh (parallel/mesh.h; one process: a mesh of size 1), and the model is
// what parallelize() made of it (parallel/parallelize.h): the trainer holds one ParallelModel
// and never asks which parallelisms it holds. train.batch_size is the global batch: each
// data-parallel rank trains on its slice, draws the same noise and timesteps for its samples as
// a single process would, and the reduced gradients make every rank take the same step, so N
// ranks reproduce the single-process run (to fp32 rounding). Logged numbers are global; only
// rank 0 writes metrics and console lines. Checkpoints are written in parts, each by the rank
// that holds it (the parameters' layouts say which), and load at any mesh.
//
// Every step reports the time this rank spent blocked in collectives (parallel/timed_comm.h);
// each logged step also names the rank that computed longest (a slow node), and
// train.trace_steps > 0 writes a Chrome trace of that many steps, from the second step of the
// run, to <out_dir>/trace/rank<R>.json (core/trace.h).
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <vector>

#include "core/config.h"
#include "diagnose/events.h"
#include "diagnose/quarantine.h"
#include "diagnose/spike_detector.h"
#include "diagnose/stragglers.h"
#include "loader/batch_source.h"
#include "loader/dataset.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "resilience/fault_injection.h"
#include "resilience/watchdog.h"
#include "model/dit.h"
#include "model/model_info.h"
#include "train/adamw.h"
#include "checkpoint/checkpointer.h"
#include "train/ema.h"
#include "train/metric_sinks.h"
#include "train/metrics.h"
#include "train/run_control.h"
#include "train/step_tap.h"
#include "train/tensorboard.h"
#include "train/validation.h"

namespace vidit {

class Fp8Casts;  // model/fp8.h

struct StepResult {
  int64_t step = 0;       // steps completed after this one
  int64_t samples = 0;    // samples in this step (all micro-batches)
  int64_t tokens = 0;     // video tokens in this step
  double flops = 0;       // training FLOPs of this step (model_info.h accounting)
  double loss = 0;        // mean over the micro-batches
  double grad_norm = 0;   // before clipping
  double lr = 0;
  double seconds = 0;
  double comm_wait_s = 0;   // time this rank was blocked in collectives
  double data_wait_s = 0;   // time spent waiting for the data source's batches
  bool skipped = false;     // no update was made: the gradient norm was not finite, or a spike was skipped
  bool spike = false;       // the loss or gradient norm spiked (diagnose/spike_detector.h)
  double loss_z = 0;        // the step's loss against its per-sigma baseline, in spreads
  bool rollback = false;    // the spike asks for a rollback (train.spike_action = "rollback"); fit() does it
  // On a GPU: the step's span on the device's stream less the time that stream stood waiting
  // for collectives, from CUDA events (core/gpu_events.h): the busy time stragglers are scored
  // by. -1 on the CPU, where the host's step time less its blocked time is that figure.
  double device_busy_s = -1;
  std::vector<double> sample_losses;  // this rank's samples' own losses (with spike detection on)
  // This rank's micro-batches by latent shape ("FxHxW", the bucket): their samples' summed loss
  // and count (TensorBoard's train/loss_by_bucket/*).
  std::map<std::string, std::pair<double, int64_t>> bucket_losses;
};

class Trainer : private CheckpointedRun {
 public:
  // `null_text` [Lt, text_dim]: the embedding used when the caption is dropped (CFG).
  // Reads `data` through an EpochSampler (fixed-shape samples).
  // `mesh`: the processes of the run (nullptr: this process alone, a mesh of size 1).
  // Construction is collective over the mesh. The model is built without storage, parallelized,
  // and then each rank allocates and initialises only its part (train.seed gives every element
  // the value a one-process run gives it) or copies its part out of train.init_from; nothing is
  // broadcast. AdamW, the EMA and checkpoint.snapshots sets of host buffers are allocated here.
  Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text,
          at::Device device = at::kCPU, std::shared_ptr<const Mesh> mesh = nullptr);
  // Reads any batch source, e.g. the latent cache's bucketed loader (variable shapes). Under data
  // parallel the source gives this rank's batches (EpochBatchSource / CacheLoader with the dp
  // rank and degree).
  Trainer(const Config& cfg, std::shared_ptr<BatchSource> source, at::Tensor null_text,
          at::Device device = at::kCPU, std::shared_ptr<const Mesh> mesh = nullptr);

  // Loads the newest checkpoint under cfg.train.out_dir that every rank reads and verifies
  // (collective); returns false when there is none. Corrupt ones are fallen back past and set
  // aside; see trainer.cpp for what stops a resume instead.
  bool resume();
  // Loads a specific checkpoint directory (this rank alone): read and verify, then apply.
  void load(const std::string& checkpoint_dir);
  // One optimizer step (grad_accum micro-batches). See train_step.cpp.
  StepResult step();
  // Steps until `until_step` (default: cfg.train.steps), logging every log_every steps,
  // checkpointing every checkpoint.every steps and at the end. Returns each step's loss.
  // `after_step`, when given, runs after every step (e.g. a periodic evaluation).
  using StepHook = std::function<void(const StepResult&)>;
  std::vector<double> fit(int64_t until_step = -1, bool console = true, const StepHook& after_step = {});
  // Writes a checkpoint now and waits for it (collective: each rank writes its part); returns
  // its directory on rank 0, "" on the others and when the save failed (reported on stderr;
  // checkpoint.failures_max failures in a row throw).
  std::string save();
  // The same in two halves (checkpoint/checkpointer.h): start_save() snapshots the state and
  // leaves the writing to a background thread (checkpoint.async; else it writes at once);
  // finish_save() waits for every save in flight and agrees with the other ranks on whether
  // each committed. Both are collective; two saves may be in flight (start_save() finishes the
  // oldest when a third comes).
  void start_save();
  std::string finish_save();
  // Rank 0's TensorBoard writer (train.tensorboard), for what callers add (the demo's samples);
  // null on the other ranks and when off.
  TensorBoardWriter* tensorboard() { return tb_.get(); }
  // Rank 0 of the mesh: the one that reports.
  bool is_lead() const { return mesh_->rank() == 0; }

  int64_t steps_done() const { return step_; }
  // fit() returned early, after a save, because a signal asked the run to stop.
  bool stopped_by_request() const { return stopped_; }
  DiT& model() { return pm_->model(); }
  const ParallelModel& parallel_model() const { return *pm_; }
  const Mesh& mesh() const { return *mesh_; }
  EMA* ema() { return ema_.get(); }
  // Whole weights by name, raw and EMA (collective over the mesh).
  TensorMap weights() const { return pm_->whole(pm_->params()); }
  TensorMap ema_weights() const { return ema_ ? pm_->whole(ema_->weights()) : TensorMap{}; }
  // The whole transformer weights to sample with: the EMA's when there is one, else the raw
  // ones; in a LoRA run (model/lora.h) the frozen base with those adapters merged (collective).
  TensorMap sampling_weights() const;
  // Runs `fn` with the parallelized model holding the sampling weights: each rank's part of the
  // EMA copied over its part of the live weights (kept aside meanwhile: one more copy of the
  // rank's part) and put back after, the model in eval mode; without EMA the live weights. A LoRA
  // run's adapters (the EMA's) stay beside its base, as merging them would give. `fn`'s forward
  // passes are collective over the mesh; the gathered weights are released after.
  void with_sampling_weights(const std::function<void(DiT&)>& fn);
  const Config& config() const { return cfg_; }
  // The validation loss every train.val_every steps and at the end of the run (train/validation.h),
  // run by fit() after the step and logged by rank 0's sinks; null: none. Every rank sets one.
  void set_validator(std::unique_ptr<Validator> v);
  // Evaluates the live weights on the validation set now and reports it (collective).
  ValidationMetrics validate();
  // A view into every following step (train/step_tap.h); null: none.
  void set_step_tap(std::shared_ptr<StepTap> tap) { tap_ = std::move(tap); }
  // Bytes of the host buffers reserved for checkpoint snapshots (checkpoint.snapshots sets of this
  // rank's part of the state; 0 on a rank that writes no part).
  int64_t snapshot_bytes() const { return ckpt_->snapshot_bytes(); }
  // <out_dir>/events.jsonl (rank 0; a sink on the others).
  EventLog& events();
  // The host of each rank, by rank.
  const std::vector<std::string>& hosts() const { return hosts_; }

 private:
  // A checkpoint read and verified into fresh memory (this rank's parts, on the CPU): nothing
  // of it reaches the live state until apply(), so a load that fails leaves no trace. The cost:
  // host memory for one copy of this rank's weights, EMA and AdamW moments during a resume
  // (16 bytes per parameter of its share; 3.5 GB per rank for 14B over 64 ranks).
  struct Staged : StagedState {
    int64_t ema_updates = 0;
    TensorMap model, ema, optimizer;
    at::Tensor rng;  // this rank's stream; undefined: a stream of its own from (seed, rank, step)
    std::map<std::string, std::vector<double>> spikes;
    SamplerState sampler;
    std::string split_changed;  // the validation split the checkpoint's run had, when it differs
  };
  // CheckpointedRun: what the checkpointer saves, and a checkpoint staged and applied.
  CheckpointState checkpoint_state() override;
  std::unique_ptr<StagedState> stage(const CheckpointReader& ckpt) const override;
  void apply(std::unique_ptr<StagedState> staged) override;
  // The Dataset constructor's work, once the mesh exists.
  Trainer(const Config& cfg, std::shared_ptr<const Dataset> data, at::Tensor null_text, at::Device device,
          std::shared_ptr<const Mesh> mesh, std::nullptr_t);
  Config cfg_;
  std::shared_ptr<BatchSource> data_;
  at::Tensor null_text_;
  at::Device device_;
  std::shared_ptr<const Mesh> mesh_;
  std::unique_ptr<ParallelModel> pm_;
  // The FP8 casts reused within a step (train.fp8_reuse_casts; model/fp8.h), cleared before
  // each step and after its update; null when off or not FP8.
  std::shared_ptr<Fp8Casts> fp8_casts_;
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
  // Fills m's slowest rank, its host and score, and the median busy time (all-gather of one
  // double), and reports ranks that become or stop being stragglers (diagnose/stragglers.h).
  void find_slowest(const StepResult& r, StepMetrics& m);
  std::unique_ptr<Validator> validator_;
  MicroBatch last_batch_;
  int64_t step_ = 0;
  double peak_tflops_ = 0;  // per device, for MFU (0: unknown)
  // Where rank 0's records go (train/metric_sinks.h; none on the others), and its events.jsonl
  // into them. Declared before everything that writes to them (the watchdog's thread, the
  // checkpointer), so they outlive it.
  bool console_ = true;
  RunSinks sinks_;
  std::unique_ptr<EventLog> events_;
  FaultInjector faults_;     // [faults]: off unless a test asks
  std::unique_ptr<TensorBoardWriter> tb_;  // rank 0 with train.tensorboard (train/tensorboard.h)
  std::unique_ptr<Watchdog> watchdog_;  // ends this process when it stops making progress
  bool stopped_ = false;
  std::shared_ptr<StepTap> tap_;
  // Saves and resumes (checkpoint/checkpointer.h).
  std::unique_ptr<Checkpointer> ckpt_;
  // Refuses (vidit::Error naming the phase, the figure and the keys) a run whose memory plan
  // needs more host memory on this node than it has (train.host_memory_gb).
  void check_memory_plan() const;
  int64_t skipped_in_a_row_ = 0;
  // Diagnosis: every rank's host (gathered at construction) and the replica check
  // (diagnose/replica_check.h), which throws ReplicasDiverged on every rank when replicas disagree.
  std::vector<std::string> hosts_;
  StragglerDetector stragglers_;
  // Spikes: this rank's samples of the step (loss, sigma, who), judged on every rank alike
  // after gathering them over "dp"; a spike writes forensics/step_N.json (rank 0).
  struct StepSamples {
    std::vector<double> loss, sigma;
    std::vector<std::string> ids;
  };
  // What a re-run of the step's forward passes needs (train.spike_rerun): each micro-batch's
  // inputs and target as the model saw them, and how many of its rows are real samples.
  struct Replay {
    at::Tensor x_t, timestep, text, target;  // x_t: the model's input (with an image-to-video condition)
    at::Tensor image;                        // CLIP features, or undefined
    int64_t samples = 0;
  };
  SpikeDetector spikes_;
  // See spike_response.cpp: judges the step; a spike is re-run, reported, and its samples blamed.
  struct SpikeResponse {
    SpikeVerdict verdict;
    bool rollback = false;
  };
  SpikeResponse judge_spike(const StepSamples& mine, const std::vector<Replay>& replay, double grad_norm, int64_t step);
  // This rank's per-sample losses of the replayed micro-batches (collective: every rank re-runs).
  std::vector<double> rerun(const std::vector<Replay>& replay);
  // Back to the newest good checkpoint after a spike at `step` (fit(); collective); false when
  // there is none yet (the step's update was skipped, and training goes on).
  bool roll_back(int64_t step);
  // Samples skipped from now on, and the rollbacks so far (diagnose/quarantine.h); the learning
  // rate's factor after them (train.rollback_lr_scale per rollback).
  std::unique_ptr<Quarantine> quarantine_;
  double lr_scale_ = 1;
  void check_replicas_or_stop();
  // The end of fit() (run_summary.cpp, collective): where rank 0 waited, by collective, and the
  // bandwidth of every mesh group, naming a group slower than the others of its kind.
  void summarize_communication();
  void open_tensorboard(bool after_rollback);
  // fit()'s parts, in the order it calls them (trainer.cpp).
  using BucketLosses = std::map<std::string, std::pair<double, int64_t>>;  // sum, count
  void open_sinks(bool after_rollback);
  void watch_heartbeats();
  void report_skipped(const StepResult& r);
  void log_step(const StepResult& r, BucketLosses& since_log);
  void pace_watchdog(const StepResult& r, int64_t first_step, std::vector<double>& step_times);
  AfterStepView after_step_view(const StepResult& r) const;
  void stop_for_signal();
};

}  // namespace vidit
