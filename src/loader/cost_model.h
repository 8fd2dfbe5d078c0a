// The predicted compute of one training sample, as a function of its video tokens: what
// data.balance = "cost" makes each rank's batch equal in (bucket_sampler.h).
//
//   cost(L) = fixed + per_token * L + per_token_pair * L^2      for a sample of L video tokens
//
// per_token: the projections, the MLP and cross-attention (its scores against the model.text_len
// text tokens every sample is padded to, so linear in L); per_token_pair: self-attention's scores
// and weighted sum; fixed: work independent of L (text and time embeddings, cross-attention's
// keys and values). From a model's shape (cost_model_for) the three are the training FLOPs of one
// sample (forward + backward) that model/model_info.h accounts, read off model_info() at three
// token counts, so the FLOP formulas live in one place.
//
// Measured times refit it: fit_cost_model() takes (bucket, tokens, samples, seconds) of real
// batches and rescales the formula's terms by least squares (relative error), in seconds;
// compare_cost_model() reports measured / predicted per bucket. A model asked about a token count
// it has no measurement for predicts from its formula and says so (estimate().note), so a caller
// can print which buckets are guesses.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"

namespace vidit {

struct CostEstimate {
  double cost = 0;        // of one sample, in CostModel::unit
  bool measured = false;  // the model was fitted on samples of exactly this many tokens
  std::string note;       // where the figure comes from, e.g. "not measured: predicted by the formula ..."
};

struct CostModel {
  double fixed = 0, per_token = 0, per_token_pair = 0;
  std::string unit = "FLOP";       // "FLOP" (from the shape) or "s" (fitted to measured times)
  std::string origin;              // one line: how the coefficients were obtained
  std::set<int64_t> measured_tokens;  // token counts of the measurements it was fitted on (empty: none)

  double cost(int64_t tokens) const {
    const double L = double(tokens);
    return fixed + per_token * L + per_token_pair * L * L;
  }
  CostEstimate estimate(int64_t tokens) const;
};

// The training FLOPs of one sample of the configured model (model.*; data.* is ignored: the token
// count is the argument of cost()). cost(tokens_per_sample(c)) == model_info(c).train_flops.
CostModel cost_model_for(const Config& c);

// One measured batch: `samples` samples of `tokens` video tokens each (one bucket) took `seconds`
// of forward + backward.
struct CostMeasurement {
  std::string bucket;
  int64_t tokens = 0;
  int64_t samples = 0;
  double seconds = 0;
};

// Refits `formula` to measured batches: per-sample seconds = x0*fixed + x1*per_token*L +
// x2*per_token_pair*L^2, minimising the squared relative error. The number of free scales follows
// the distinct token counts measured: one (the whole formula scaled) for one count, two (linear
// part, attention part) for two, three for three or more; a scale that comes out negative (noise)
// merges its term with the others'. Throws vidit::Error naming the bad measurement (no samples,
// non-positive time or tokens) or when there is none.
CostModel fit_cost_model(const std::vector<CostMeasurement>& measurements, const CostModel& formula);

// Predicted against measured, per bucket (measurements pooled by bucket name, in first-seen order).
struct CostCheck {
  std::string bucket;
  int64_t tokens = 0;
  int64_t samples = 0;
  double measured_s = 0;   // per sample
  double predicted = 0;    // per sample, in model.unit
  double ratio = 0;        // measured / predicted; for a FLOP model, after one common scale
                           // (sum measured / sum predicted), so 1.0 means "in proportion"
  CostEstimate estimate;   // what the model says about this bucket (measured or not)
};
std::vector<CostCheck> compare_cost_model(const CostModel& model, const std::vector<CostMeasurement>& measurements);
std::string format_cost_checks(const CostModel& model, const std::vector<CostCheck>& checks);

}  // namespace vidit
