// The cost of a training step on a mesh, per rank, from the config alone (no weights, no
// processes): the memory of the training state and the bytes each rank sends per optimizer step,
// by collective. `vidit plan` prints it for one mesh, or for every mesh of a world size with the
// ones that fit a GPU's memory marked.
//
// Bytes are counted as a bandwidth-optimal algorithm sends them from each rank (the convention of
// NCCL's "bus bandwidth"): all-reduce of N bytes over n ranks 2(n-1)/n N; all-gather and
// reduce-scatter of N bytes in total (n-1)/n N; all-to-all of N bytes (n-1)/n N; send N.
// CountingComm (parallel/counting_comm.h) counts the collectives a run really issues the same way,
// and a test checks the two agree.
//
// What each parallelism moves per optimizer step (A micro-batches of b samples per dp rank,
// L tokens, Lc = L / (ulysses x ring) per rank, d = dim, P parameters):
//   data parallel   all-reduce of P fp32 gradients once, over dp (x sp when tokens are split);
//   FSDP            per micro-batch, all-gather of the root unit once and of every block once,
//                   or twice with reshard_after_forward; reduce-scatter of P gradients
//                   (parallel.reduce_dtype); then all-reduce of the P/S shard over sp and over
//                   replicate when those are > 1;
//   Ulysses         per block and micro-batch, all-to-all of q, k, v and the output
//                   (b x Lc x d each) forward and of their gradients backward;
//   ring            per block and micro-batch, r-1 hops of K and V (b x L/r x d/u each) forward;
//                   r-1 hops of K, V and r of dK, dV backward;
//   sequence split  all-gather of the head's output (b x L x C_out*patch) per micro-batch;
//   tensor          per block and micro-batch, all-reduce over tensor of 3 b x Lc x d partial
//                   outputs forward and of 3 b x Lc x d + b x Lt x d input gradients backward,
//                   plus the QK norms' sums of squares (b x (3 Lc + Lt)) both ways; data
//                   parallel and FSDP then move each rank's P_T = its part of the parameters,
//                   and Ulysses and ring move d / T of the features;
//   bookkeeping     all-reduce of 4 doubles over dp (logged totals); for the gradient norm one
//                   double per set of groups some parameters are cut over, over each of its
//                   groups (FSDP: 1 over shard; with tensor parallel 2 over shard and 1 over
//                   tensor; tensor parallel alone 1 over tensor).
// Exact for fp32 training; with bf16 the activation exchanges move fewer bytes than stated.
//
// Memory per rank: fp32 weights, gradients, AdamW moments and EMA of what the rank keeps of every
// parameter, read from the layouts parallelize() gives them (planned_layouts: tensor-parallel
// parts, then FSDP's padded shards), plus the largest gathered units (root and two blocks, as
// each rank holds them before FSDP); activations are an
// estimate, (18 d + 2 ffn) x 4 bytes per local token per block (what a block saves for
// backward), not a measurement, unless measured activations are given
// (parallel/activation_memory.h: what a block of the run's shapes holds on its device, which
// `vidit plan --measure` and the trainer's choice for train.memory_budget_gb use); a block recomputed whole keeps d x 4 bytes per token, one
// recomputed selectively 5 [b, L, d] values (q, k, v and the attention's output in bf16 under
// autocast), plus one block's full set while it is recomputed; a recomputed block runs its
// forward collectives (tensor parallel; Ulysses and ring only when whole) twice.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "parallel/activation_memory.h"

namespace vidit {

// Activation checkpointing per block (model/recompute.h): the first `whole` blocks recomputed
// whole, the next `selective` selectively, the rest keeping their activations.
struct RecomputeCounts {
  int64_t whole = 0, selective = 0;
};

struct StepPlan {
  int64_t world = 1;
  bool measured_activations = false;  // activations from a BlockActivations, not the formula
  RecomputeCounts recompute;
  int64_t params = 0;
  int64_t lora_params = 0;  // LoRA's adapters (model/lora.h), the only parameters that train; 0 without
  // Memory per rank, bytes.
  double weights = 0, grads = 0, optimizer = 0, ema = 0, gathered = 0, activations = 0;
  // FSDP's transient buffers: the receive buffer of the gather in flight, one unit's whole
  // gradients as backward makes them, and the packed gradients of the (at most) two units whose
  // reduce-scatter is in flight, each with the engine's working copy.
  double fsdp_buffers = 0;
  double memory() const { return weights + grads + optimizer + ema + gathered + fsdp_buffers + activations; }
  // The phases around the step, per rank, bytes (train/trainer.h builds the model without
  // storage, parallelizes it, then fills each rank's part: model/param_storage.h):
  //   construction  the rank's parts of the weights, AdamW and EMA, plus the transient of filling
  //                 them (a bounded fp64 buffer, or one whole tensor cut from init_from's file);
  //                 a LoRA run holds its frozen base whole in fp32 while it is stored in
  //                 lora.base_dtype;
  //   snapshots     host buffers for saves: checkpoint.snapshots sets of the part this rank
  //                 writes (weights, EMA, AdamW), allocated at construction, held all run;
  //   resume        host, while a checkpoint is read: a staged copy of the rank's state (weights,
  //                 EMA, AdamW) plus one whole tensor put together from the parts;
  //   runtime       the process's own memory before any tensor (LibTorch, the communicator,
  //                 thread stacks): kRuntimeBytes, measured;
  //   samples       sample.every's rounds (pipeline/training_samples.h): the run's model with its
  //                 EMA part swapped in, the live part kept aside meanwhile (one more copy of the
  //                 rank's trained part); a no-grad forward at batch 2 holds far less than a
  //                 step's activations and gradients, so the step's figure bounds the rest.
  double largest_tensor = 0;  // the largest whole parameter, fp32
  double construction = 0, snapshots = 0, resume = 0, runtime = 0, samples = 0;
  bool sampling = false;  // sample.every > 0
  // Peak of each phase per rank on this device (the host when training on the CPU; on a GPU the
  // device's figure, the host buffers being separate): construction, step (the above), save, resume.
  double construction_peak() const { return runtime + construction + snapshots; }
  double step_peak() const { return runtime + memory() + snapshots; }
  double resume_peak() const { return runtime + weights + optimizer + ema + snapshots + resume; }
  double samples_peak() const { return sampling ? step_peak() + samples : 0; }  // 0: no samples
  // `vidit export` of a checkpoint (train/run_weights.h, streaming): one process, one whole tensor
  // read from the parts and its renamed / converted copy at a time, whatever the mesh that saved it.
  double export_peak() const { return runtime + 2 * largest_tensor; }
  // Bytes sent per rank per optimizer step, by collective ("all_reduce", "all_gather",
  // "reduce_scatter", "all_to_all", "send"), and by what they are for.
  std::map<std::string, double> by_collective, by_purpose;
  double comm() const;
};

// The resident memory of a training process before its model: LibTorch and its thread pools,
// the communicator. Measured on the CPU build as the resident set of a process with its MPI
// communicator and mesh up (bench_memory's "runtime" row: 119-120 MiB per rank under mpirun).
// A GPU process adds its CUDA context, which `vidit plan` does not yet count.
constexpr double kRuntimeBytes = 120.0 * (1 << 20);

// `measured`: a block's activations as measured (nullptr: the formula above).
StepPlan plan_step(const Config& cfg, const BlockActivations* measured = nullptr);
// The plan with the blocks recomputed as given, whatever the config says.
StepPlan plan_step(const Config& cfg, RecomputeCounts recompute, const BlockActivations* measured = nullptr);
// Which blocks are recomputed: train.recompute_blocks of train.recompute_policy; or, with
// train.memory_budget_gb > 0, the least recomputation whose planned memory per rank fits the
// budget. Blocks switch from keeping their activations to selective recomputation first (it
// frees most of a block's activations and does not run attention again), then from selective to
// whole. A budget that not even every block recomputed whole fits is an error naming the key,
// the memory needed and what to change.
RecomputeCounts recompute_counts(const Config& cfg, const BlockActivations* measured = nullptr);
std::string format_plan(const Config& cfg, const StepPlan& plan);

// Every mesh of `world` ranks that validate_mesh() accepts for this config, its
// plan, and whether its memory fits `gpu_bytes` (0: no limit), fewest bytes sent first.
struct MeshChoice {
  ParallelConfig mesh;
  StepPlan plan;
  bool fits = true;
};
std::vector<MeshChoice> plan_meshes(const Config& cfg, int64_t world, double gpu_bytes);
std::string format_meshes(const Config& cfg, const std::vector<MeshChoice>& choices, double gpu_bytes);

}  // namespace vidit
