#include "parallel/plan.h"

#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"
#include "parallel/mesh.h"
#include "model/fp8.h"
#include "model/lora.h"
#include "model/model_info.h"
#include "parallel/fsdp.h"
#include "parallel/parallelize.h"

namespace vidit {

double StepPlan::comm() const {
  double t = 0;
  for (const auto& [k, v] : by_collective) t += v;
  return t;
}

StepPlan plan_step(const Config& cfg, const BlockActivations* measured) {
  return plan_step(cfg, recompute_counts(cfg, measured), measured);
}

RecomputeCounts recompute_counts(const Config& cfg, const BlockActivations* measured) {
  const int64_t layers = cfg.model.layers;
  const double budget = cfg.train.memory_budget_gb * double(1ll << 30);
  if (budget <= 0) {
    const int64_t n = cfg.train.recompute_blocks < 0 ? layers : std::min(cfg.train.recompute_blocks, layers);
    return cfg.train.recompute_policy == RecomputePolicy::selective ? RecomputeCounts{0, n} : RecomputeCounts{n, 0};
  }
  auto fits = [&](RecomputeCounts c) { return plan_step(cfg, c, measured).memory() <= budget; };
  for (int64_t s = 0; s <= layers; ++s)
    if (fits({0, s})) return {0, s};
  for (int64_t w = 1; w <= layers; ++w)
    if (fits({w, layers - w})) return {w, layers - w};
  const StepPlan least = plan_step(cfg, {layers, 0}, measured);
  fail("train.memory_budget_gb = ", cfg.train.memory_budget_gb, ": even with every block recomputed the plan needs ",
       least.memory() / double(1ll << 30), " GiB per rank (activations ", least.activations / double(1ll << 30),
       " GiB). Raise the budget, shard the weights (parallel.shard), split the tokens (parallel.ulysses / ring) or "
       "lower train.batch_size");
}

StepPlan plan_step(const Config& cfg, RecomputeCounts rc, const BlockActivations* measured) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  StepPlan plan;
  plan.recompute = rc;
  const double S = double(p.shard), R = double(p.replicate), u = double(p.ulysses), r = double(p.ring),
               T = double(p.tensor), dp = R * S, sp = u * r;
  plan.world = p.replicate * p.shard * p.ulysses * p.ring * p.tensor;
  plan.params = count_parameters(m);
  const double d = double(m.dim);
  // Each rank's part of every parameter, from the layouts parallelize() gives them: P_T (what a
  // rank holds before FSDP: tensor-parallel parts), and what it keeps (FSDP shards, padded).
  TensorMap whole;
  for (const auto& [name, shape] : parameter_shapes(m))
    whole[name] = at::empty(shape, at::TensorOptions().device(at::kMeta));
  double P = 0, kept = 0, root = 0, block = 0;
  double block_fp8 = 0;  // of block: weights FSDP gathers in e4m3 (parallel.fp8_all_gather)
  double block_scales = 0;  // their scales, agreed over "shard" each forward
  double block_fp8_cast = 0;  // of block: weights that multiply in FP8 (cast to e4m3 once a step)
  const bool fp8 = uses_fp8(cfg.train.precision);
  const GatherOptions gather = gather_options(cfg);
  // The gradient norm (layout.h global_norms_by_part) all-reduces one double per (part of the
  // model, set of groups cut over) over each group in the set: counted per group.
  std::set<std::pair<std::string, std::set<std::string>>> norm_keys;
  for (const auto& [name, l] : planned_layouts(whole, p)) {
    std::set<std::string> over;
    for (const Cut& c : l.cuts) over.insert(c.over);
    norm_keys.insert({model_part(name), over});
    size_t unflattened = 0;
    while (unflattened < l.cuts.size() && l.cuts[unflattened].kind != Cut::Kind::Flat) ++unflattened;
    auto numel = [](const std::vector<int64_t>& shape) {
      double n = 1;
      for (int64_t x : shape) n *= double(x);
      return n;
    };
    const std::vector<int64_t> shape = l.shape_after(unflattened);
    const double part = numel(shape);
    P += part;
    kept += numel(l.local_shape());
    if (name.rfind("blocks.0.", 0) == 0) {
      block += part;
      const bool in_fp8 = fp8 && shape.size() == 2 && fp8_projection_weight(name) && fp8_eligible(shape[1], shape[0]);
      if (in_fp8) block_fp8_cast += part;
      if (gather.fp8 && in_fp8) block_fp8 += part, block_scales += gather.rowwise ? double(shape[0]) : 1;
    }
    else if (name.rfind("blocks.", 0) != 0) root += part;
  }
  const double A = double(cfg.train.grad_accum), b = std::ceil(double(cfg.train.batch_size) / dp);
  const double L = double(tokens_per_sample(cfg)), Lc = L / sp, Lt = double(m.text_len);
  const double patch = double(m.patch[0] * m.patch[1] * m.patch[2]);
  const bool bf16 = cfg.train.precision != Precision::fp32;  // FP8 keeps bf16 activations

  auto norm_doubles = [&](const char* group) {
    double n = 0;
    for (const auto& key : norm_keys) n += key.second.count(group) ? 1 : 0;
    return n;
  };
  auto add = [&](const char* collective, const std::string& purpose, double bytes) {
    if (bytes <= 0) return;
    plan.by_collective[collective] += bytes;
    plan.by_purpose[purpose] += bytes;
  };
  auto all_reduce = [](double n, double bytes) { return n > 1 ? 2 * (n - 1) / n * bytes : 0.0; };
  auto spread = [](double n, double bytes) { return n > 1 ? (n - 1) / n * bytes : 0.0; };  // gather / scatter / a2a

  // Memory.
  // fp32 shards, and each FP8 weight's shard cast to e4m3 once per forward (1 byte a weight).
  // Weights held whole keep their e4m3 casts for the step instead (train.fp8_reuse_casts).
  plan.weights = 4 * kept + (gather.fp8 && p.shard > 1 ? block_fp8 * double(m.layers) / S : 0) +
                 (cfg.train.fp8_reuse_casts && p.shard <= 1 ? block_fp8_cast * double(m.layers) : 0);
  plan.grads = 4 * kept;
  plan.optimizer = 8 * kept;
  plan.ema = cfg.train.ema_decay > 0 ? 4 * kept : 0;
  // LoRA (model/lora.h): the adapters are all that trains (no tensor parallel or FSDP), the
  // targeted weights are stored in lora.base_dtype, and nothing else has a gradient.
  const LoraCounts lora = lora_counts(m, cfg.lora);
  if (cfg.lora.rank > 0) {
    // fp8: one byte a weight and an fp32 scale per output row.
    const double base_bytes = cfg.lora.base_dtype == Precision::bf16 ? 2 : cfg.lora.base_dtype == Precision::fp8 ? 1 : 4;
    plan.lora_params = lora.adapter_params;
    plan.weights += 4 * double(lora.adapter_params) - (4 - base_bytes) * double(lora.adapted_weights) +
                    (cfg.lora.base_dtype == Precision::fp8 ? 4 * double(lora.adapted_rows) : 0);
    plan.grads = 4 * double(lora.adapter_params);
    plan.optimizer = 8 * double(lora.adapter_params);
    plan.ema = cfg.train.ema_decay > 0 ? 4 * double(lora.adapter_params) : 0;
  }
  // The phases around the step (plan.h).
  double largest = 0, largest_part = 0;
  for (const auto& [name, l] : planned_layouts(whole, p)) {
    double n = 1, k = 1;
    for (int64_t x : l.shape) n *= double(x);
    for (int64_t x : l.local_shape()) k *= double(x);
    largest = std::max(largest, 4 * n), largest_part = std::max(largest_part, k);
  }
  plan.largest_tensor = largest;
  const double trained = plan.grads;  // fp32 bytes of what this rank trains (its parts, or the adapters)
  plan.snapshots = double(cfg.checkpoint.snapshots) * (trained + plan.optimizer + plan.ema);
  // Filling a part: an fp64 buffer of at most 4 Mi values; from init_from, the part cut out of
  // the mapped whole tensor (the whole tensor's pages are the file's, not the heap's).
  const double fill = 8 * std::min<double>(largest_part, 4 << 20);
  plan.construction = plan.weights + plan.optimizer + plan.ema + fill;
  if (cfg.lora.rank > 0) plan.construction += 4 * double(plan.params) - (plan.weights - 4 * double(lora.adapter_params));
  plan.resume = trained + plan.optimizer + plan.ema + largest;
  // sample.every: the live part kept aside while the EMA's is swapped in (no EMA: nothing).
  plan.sampling = cfg.sample.every > 0;
  plan.samples = plan.sampling ? plan.ema : 0;
  plan.runtime = kRuntimeBytes;
  // Gathered weights fill the model's fp32 parameters, or e4m3 copies of the FP8 ones.
  const double block_held = 4 * (block - block_fp8) + block_fp8;
  plan.gathered = p.shard > 1 ? 4 * root + std::min<double>(2, m.layers) * block_held : 0;
  // FSDP's buffers (plan.h): the receive buffer of the gather in flight (the next block's,
  // prefetched: its weights as they travel), one unit's whole gradients as backward makes them,
  // the packed gradients of the two units whose reduce-scatter is in flight, and the engine's
  // working copy of each (MPI's reduce-scatter reduces into a buffer of the whole input).
  const double wire = double(c10::elementSize(gather.dtype)) * (block - block_fp8) + block_fp8;
  const double unit = std::max(root, block), packed = p.reduce_dtype == Precision::bf16 ? 2 : 4;
  plan.fsdp_buffers = p.shard > 1 && cfg.lora.rank == 0 ? wire + 4 * unit + 2 * 2 * packed * unit : 0;
  // On the host (the MPI engine), the nonblocking reduce-scatter of Open MPI's libnbc reduces
  // along a binomial tree to the group's first member and then scatters: a member receives each
  // child's whole input into a buffer of its own, so the first member (log2 S children) holds that
  // many more whole units per reduce-scatter in flight (measured at 8 ranks: the even ranks, which
  // have children, peaked 0.3-0.5 GB above the odd ones, rank 0 most). The plan is the worst
  // member's. NCCL's reduce-scatter keeps no such buffers.
  const bool host_engine = cfg.train.device == DeviceChoice::cpu ||
                           (cfg.train.device == DeviceChoice::automatic && !at::hasCUDA());
  if (plan.fsdp_buffers > 0 && host_engine) plan.fsdp_buffers += 2 * std::ceil(std::log2(S)) * packed * unit;
  // Blocks recomputed whole keep their input only, those recomputed selectively also the
  // self-attention's q, k, v and output (5 [b, L, d] values, q, k, v and the output in bf16 when
  // autocast is on); one of them at a time holds its full activations again during its backward.
  const double layers = double(m.layers);
  const double n_whole = double(rc.whole), n_selective = double(rc.selective), recomputed = n_whole + n_selective;
  double per_block = b * Lc * (18 * d + 2 * double(m.ffn_dim)) * 4;
  // Image-to-video: the image branch's attention output [b, L, d] and its keys and values
  // [b, image tokens, d] per block.
  if (m.image_dim > 0)
    per_block += b * Lc * d * 4 + b * double(m.image_pos_tokens > 0 ? m.image_pos_tokens : kImageTokens) * 2 * d * 4;
  double held_whole = b * Lc * d * 4, held_selective = b * Lc * d * (4 + 4 * (bf16 ? 2 : 4));
  if (measured) {
    per_block = measured->keep.bytes(b, Lc);
    held_whole = measured->whole.bytes(b, Lc);
    held_selective = measured->selective.bytes(b, Lc);
    plan.measured_activations = true;
  }
  plan.activations = (layers - recomputed) * per_block + n_whole * held_whole + n_selective * held_selective +
                     (recomputed > 0 ? per_block : 0);

  // Gradients.
  if (p.shard > 1) {
    const double gathers = 1 + (p.reshard_after_forward ? 2 : 1) * double(m.layers);
    const double g = double(c10::elementSize(gather.dtype));  // bytes a weight in parallel.gather_dtype
    add("all_gather", "FSDP weights", A * spread(S, g * root) +
                                          A * (gathers - 1) * spread(S, g * (block - block_fp8) + block_fp8));
    if (gather.fp8) add("all_reduce", "FSDP FP8 scales", A * all_reduce(S, 4 * block_scales * double(m.layers)));
    add("reduce_scatter", "FSDP gradients", A * spread(S, (p.reduce_dtype == Precision::bf16 ? 2 : 4) * P));
    add("all_reduce", "FSDP gradients over sp", A * all_reduce(sp, 4 * P / S));
    add("all_reduce", "HSDP gradients over replicate", A * all_reduce(R, 4 * P / S));
    add("all_reduce", "bookkeeping", all_reduce(S, 8 * norm_doubles("shard")));
  } else {
    add("all_reduce", "data-parallel gradients", all_reduce(dp * sp, 4 * (cfg.lora.rank > 0 ? double(lora.adapter_params) : P)));
  }
  add("all_reduce", "bookkeeping", all_reduce(dp, 32));
  // Spike detection (diagnose/spike_detector.h): each dp rank's sample count, then every
  // sample's loss, sigma and rank, gathered (the samples' ids only on a flagged step).
  if (cfg.train.spike_action != SpikeAction::off) {
    add("all_reduce", "bookkeeping", all_reduce(dp, 8));
    add("all_gather", "bookkeeping", spread(dp, dp * A * b * 3 * 8));
  }
  add("all_reduce", "bookkeeping", all_reduce(T, 8 * norm_doubles("tensor")));

  // Heads and MLP units split over tensor: per block and micro-batch, forward sums the partial
  // outputs of both o projections and the MLP and the QK norms' sums of squares; backward sums
  // the gradients of the inputs of q / k / v, cross-attention q, the text context and the MLP,
  // and the norms' again.
  const double norms = 4 * b * (3 * Lc + Lt);
  // A recomputed block runs its forward collectives twice.
  add("all_reduce", "tensor parallel", A * ((layers + recomputed) * all_reduce(T, 3 * b * Lc * d * 4 + norms) +
                                            layers * all_reduce(T, 3 * b * Lc * d * 4 + b * Lt * d * 4 + norms)));
  // Tokens split over sp.
  const double act = 4, v_bytes = bf16 ? 2 : 4;
  // Attention sees this rank's heads: d / T features under tensor parallel.
  const double dh = d / T;
  // Selective recomputation does not run the self-attention (with its exchanges) again.
  const double attention_rerun = n_whole;
  add("all_to_all", "Ulysses", A * (2 * layers + attention_rerun) * spread(u, b * Lc * dh * (act + act + v_bytes + act)));
  const double kv = 2 * b * (L / r) * (dh / u) * 4;
  if (p.ring > 1)
    add("send", "ring attention", A * ((layers + attention_rerun) * (r - 1) * kv + layers * ((r - 1) * kv + r * kv)));
  add("all_gather", "sequence output", A * spread(sp, b * L * double(m.out_channels) * patch * 4));
  return plan;
}

namespace {

std::string human(double bytes) {
  char buf[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) bytes /= 1024, ++i;
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[i]);
  return buf;
}

std::string mesh_name(const ParallelConfig& p) {
  std::ostringstream os;
  os << "replicate " << p.replicate << " x shard " << p.shard << " x ulysses " << p.ulysses << " x ring " << p.ring
     << " x tensor " << p.tensor;
  return os.str();
}

}  // namespace

std::string format_plan(const Config& cfg, const StepPlan& plan) {
  std::ostringstream os;
  os << "mesh            " << mesh_name(cfg.parallel) << " (" << plan.world << " ranks)\n"
     << "per rank        weights " << human(plan.weights) << ", grads " << human(plan.grads) << ", AdamW "
     << human(plan.optimizer) << ", EMA " << human(plan.ema) << ", gathered " << human(plan.gathered) << ", FSDP buffers " << human(plan.fsdp_buffers)
     << ", activations ~" << human(plan.activations)
     << (plan.measured_activations ? " (a block's, measured)" : " (estimate)") << "\n"
     << "                total ~" << human(plan.memory()) << "\n"
     << "peak by phase   construction " << human(plan.construction_peak()) << ", step "
     << human(plan.step_peak()) << ", resume " << human(plan.resume_peak())
     << (plan.sampling ? ", samples (sample.every) " + human(plan.samples_peak()) : std::string())
     << ", export " << human(plan.export_peak()) << " (one process) per rank (runtime "
     << human(plan.runtime) << ", checkpoint snapshots " << human(plan.snapshots) << " in "
     << cfg.checkpoint.snapshots << " set" << (cfg.checkpoint.snapshots == 1 ? "" : "s")
     << " of host memory: checkpoint.snapshots; the largest whole tensor " << human(plan.largest_tensor) << ")\n";
  if (plan.lora_params > 0)
    os << "LoRA            " << plan.lora_params << " adapter parameters train (rank " << cfg.lora.rank
       << "); every other weight is frozen (grads, AdamW and EMA hold the adapters only)\n";
  os
     << "recompute       " << plan.recompute.whole << " blocks whole, " << plan.recompute.selective << " selectively, "
     << cfg.model.layers - plan.recompute.whole - plan.recompute.selective << " keep their activations"
     << (cfg.train.memory_budget_gb > 0 ? " (the least that fits train.memory_budget_gb)" : "") << "\n"
     << "sent per step   " << human(plan.comm()) << " per rank\n";
  for (const auto& [k, v] : plan.by_purpose) os << "    " << k << ": " << human(v) << "\n";
  return os.str();
}

std::vector<MeshChoice> plan_meshes(const Config& cfg, int64_t world, double gpu_bytes) {
  std::vector<MeshChoice> out;
  for (int64_t tensor = 1; tensor <= world; ++tensor)
  for (int64_t shard = 1; tensor * shard <= world; ++shard)
    for (int64_t ulysses = 1; tensor * shard * ulysses <= world; ++ulysses)
      for (int64_t ring = 1; tensor * shard * ulysses * ring <= world; ++ring) {
        const int64_t used = tensor * shard * ulysses * ring;
        if (world % used) continue;
        Config c = cfg;
        c.parallel.shard = shard, c.parallel.ulysses = ulysses, c.parallel.ring = ring, c.parallel.tensor = tensor;
        c.parallel.replicate = world / used;
        try {
          validate_mesh(c, int(world));
        } catch (const Error&) {
          continue;
        }
        MeshChoice ch{c.parallel, plan_step(c), true};
        ch.fits = gpu_bytes <= 0 || ch.plan.memory() <= gpu_bytes;
        out.push_back(ch);
      }
  std::stable_sort(out.begin(), out.end(), [](const MeshChoice& a, const MeshChoice& b) {
    if (a.fits != b.fits) return a.fits;
    return a.plan.comm() < b.plan.comm();
  });
  return out;
}

std::string format_meshes(const Config& cfg, const std::vector<MeshChoice>& choices, double gpu_bytes) {
  std::ostringstream os;
  os << "meshes of " << (choices.empty() ? 0 : choices[0].plan.world) << " ranks for " << cfg.source
     << (gpu_bytes > 0 ? " (fits: memory per rank <= " + human(gpu_bytes) + ")" : "") << ", fewest bytes sent first:\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-4s %-56s %14s %14s\n", "fits", "mesh", "memory/rank", "sent/step");
  os << line;
  for (const auto& c : choices) {
    std::snprintf(line, sizeof line, "  %-4s %-56s %14s %14s\n", c.fits ? "yes" : "no", mesh_name(c.mesh).c_str(),
                  human(c.plan.memory()).c_str(), human(c.plan.comm()).c_str());
    os << line;
  }
  if (choices.empty()) os << "  (none: no mesh of this size splits the heads and tokens evenly)\n";
  if (cfg.data.source != DataSource::cache)
    os << "  (data-parallel degrees must divide the global train.batch_size = " << cfg.train.batch_size
       << "; raise it with --set to list more)\n";
  return os.str();
}

}  // namespace vidit
