// The validation loss: the flow-matching loss of the live weights on clips that never train
// (loader/validation_split.h), at fixed noise levels (train.val_sigmas) with fixed noise, every
// train.val_every steps and at the end of the run, and once before the first step of a run that
// starts from step 0 (the baseline).
//
// Everything random is fixed by the clip: its noise is drawn from a generator seeded by its key,
// its latent is the cached posterior mean, its caption is kept (no dropout). The figure thus
// depends on the weights alone: the same at any world size, across restarts and between runs of
// other seeds, so two runs' curves compare point by point.
//
// The clips are dealt round-robin over the data-parallel ranks; the members of a sequence- or
// tensor-parallel group evaluate the same clip together. Each forward is one clip at one noise
// level (batch 1: no more memory than a training step). Every rank makes the same number of
// forward passes (a rank without a clip in the last round computes a stand-in it discards), since
// sharded parameters are gathered collectively. Each clip's losses land in their own cells of a
// [clips, noise levels] table that one all-reduce fills (adding zeros is exact), and the means
// are taken in clip order: the same bits whatever the number of ranks.
//
// Reported overall, per noise level, and per bucket (train/metrics.h's ValidationMetrics). A clip
// that cannot be read is left out of the means and named on stderr; the run goes on. One expert
// of a two-expert model (train.expert) is validated at the noise levels it serves.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "loader/validation_split.h"
#include "model/dit.h"
#include "parallel/mesh.h"
#include "train/metrics.h"

namespace vidit {

class Validator {
 public:
  // Throws vidit::Error when no noise level of train.val_sigmas lies in the expert's range.
  Validator(const Config& cfg, ValidationSet set, at::Device device);

  // Whether step `step` is validated: every train.val_every steps and the run's last.
  bool due(int64_t step) const;
  // Evaluates `model` (the parallelized DiT, in eval mode, under no_grad: the trainer's
  // validate()). Collective over the mesh; every rank returns the same figures (clips = 0 when
  // no held-out clip could be read).
  ValidationMetrics run(DiT& model, const Mesh& mesh, int64_t step) const;

  const ValidationSet& set() const { return set_; }
  const std::vector<double>& sigmas() const { return sigmas_; }

 private:
  Config cfg_;
  ValidationSet set_;
  at::Device device_;
  std::vector<double> sigmas_;
};

}  // namespace vidit
