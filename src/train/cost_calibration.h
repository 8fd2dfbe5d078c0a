// Cost calibration: the cost model of data.balance = "cost" (loader/cost_model.h) refitted to this
// run's own measured step times before training starts, so that batches are equal in measured
// compute rather than in the FLOP formula's (which misjudges batches of many short clips, whose
// elementwise work it does not count).
//
// Rank 0 times, for each distinct token count among the cache's buckets, forward + flow-matching
// loss + backward of a batch of the size the token budget gives it (max(1, budget / tokens)
// samples: per-sample overhead depends on the batch size) on the training device, under the run's
// precision (autocast, FP8 projections), on a plain DiT(cfg.model) with random weights and inputs:
// one warm-up, then the fastest of up to 3 rounds (fewer when the warm-up says the rounds would
// take over two minutes). fit_cost_model() turns the times into coefficients in seconds, which
// rank 0 broadcasts so every rank builds the same plan.
//
// The result is kept in <out_dir>/cost_model.json (written atomically). A later attempt of the run
// (a restart, a resume) reads it instead of measuring, so its batches are exactly those of the
// uninterrupted run; `vidit train --fresh` sets it aside with the run's other files. A file that
// does not parse, or was made for another model, precision, device type or set of buckets, is
// reported and measured again. If the measurement itself fails (e.g. the batch does not fit in
// memory without the trainer's parallelism and recompute), the FLOP formula is used, with a
// warning, and that too is recorded so the run stays consistent; delete the file to measure again.
//
// Limits: the plain model has no FSDP / tensor / sequence parallelism or activation recompute, so
// its absolute times are a single device's; the fit only needs their ratios across buckets.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "loader/cost_model.h"
#include "loader/latent_cache.h"
#include "parallel/comm.h"

namespace vidit {

// One bucket of the latent cache: its name and latent shape [C, T, H, W].
struct LatentBucket {
  std::string name;
  std::vector<int64_t> shape;
};
// The cache's buckets in the order CacheLoader numbers them (first appearance in the index).
std::vector<LatentBucket> latent_buckets(const LatentCache& cache);

struct CostCalibration {
  CostModel model;                            // what sizes the batches (identical on every rank)
  bool reused = false;                        // read from <out_dir>/cost_model.json (no measurement)
  std::vector<CostMeasurement> measurements;  // rank 0: what the model was fitted to (measured or read)
  double seconds = 0;                         // rank 0: time the measurement took (0 when reused)
  std::string path;                           // <out_dir>/cost_model.json
};

// Collective over `world`: every rank calls it with the same arguments and gets the same model.
// Rank 0 measures (or reuses <out_dir>/cost_model.json, creating out_dir if needed), prints one
// line saying which, with the per-bucket measured / predicted check, and broadcasts the
// coefficients. Throws vidit::Error for an empty bucket list or a bucket whose shape model.patch
// does not divide.
CostCalibration calibrate_cost_model(const Config& cfg, const std::vector<LatentBucket>& buckets, at::Device device,
                                     Comm& world, const std::string& out_dir);

}  // namespace vidit
