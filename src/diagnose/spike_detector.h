// Loss and gradient-norm spikes, judged the way flow matching needs. A sample's loss depends
// strongly on its noise level σ (near σ = 0 the model must guess the noise from a clean
// latent, near σ = 1 the clean latent from noise), so a batch that drew hard σs has a high loss
// without anything being wrong, and a running mean of the step loss mistakes it for a spike.
// Instead every sample's own loss is compared with a baseline of its σ bin:
//  - the σ range [0, 1] is cut into `bins` bins; each keeps an exponentially weighted mean and
//    variance of the losses of its samples (a plain average while it has few);
//  - a sample's z is (loss - bin mean) / bin spread, once its bin has seen `warmup` samples;
//  - the step's loss z is the sum of its samples' z over the square root of their number (the
//    standardized mean: about N(0, 1) for an ordinary batch of any size);
//  - the gradient norm has its own baseline, of log(norm) over steps (a norm that jumps by a
//    factor, whatever its scale);
//  - a step whose loss z or gradient z exceeds `z` is a spike. Its values do not enter the
//    baselines, so one bad batch does not raise the bar for the next.
// Only upward deviations count: a loss that falls faster than usual is not a problem.
// Each part of the model (every block, the embeddings, the head) also keeps a baseline of its
// own log gradient norm, so that a spike's report names the blocks whose gradients jumped.
// The baselines are part of a checkpoint (state() / set_state()), so a resumed run judges its
// first steps as the uninterrupted run would, without warming up again.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vidit {

struct SpikeOptions {
  int64_t bins = 8;
  double z = 6;          // threshold, in spreads
  int64_t warmup = 8;    // samples a σ bin (steps, for the gradient norm) sees before it judges
  double decay = 0.98;   // weight of the past in the running mean and variance
};

struct SampleLoss {
  double sigma = 0, loss = 0;
};

struct SpikeVerdict {
  bool spike = false;
  double loss_z = 0, grad_z = 0;   // 0 when not judged yet
  int64_t judged = 0;              // samples whose bin was warm
  std::vector<double> sample_z;    // per sample (NaN: its bin was not warm)
  std::vector<double> baseline;    // per sample: its bin's mean loss (NaN: not warm)
  std::string why;                 // "loss" or "gradient norm" or both, for the report
};

// A part's gradient norm at a flagged step against its running typical value (the exponential
// of its mean log norm; 0 before it has one).
struct PartNorm {
  std::string part;
  double norm = 0, typical = 0, ratio = 0;  // ratio: norm / typical (0: no typical value yet)
};

class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeOptions o = {});
  // One step: every sample of the global batch (all ranks, any order) and the global gradient
  // norm. A non-finite norm is judged elsewhere (the update is skipped) and not learned from.
  SpikeVerdict observe(const std::vector<SampleLoss>& samples, double grad_norm);
  int64_t bin_of(double sigma) const;
  // The parts' gradient norms of the same step, largest jump first; they are learned when
  // `learn` (the step was not a spike).
  std::vector<PartNorm> parts(const std::map<std::string, double>& norms, bool learn);
  // The baselines by name ("bins": 3 values per σ bin, "grad", "part.<name>": mean, variance,
  // count each). set_state() returns false, and keeps the detector as it is, when the state
  // was written with another number of σ bins.
  std::map<std::string, std::vector<double>> state() const;
  bool set_state(const std::map<std::string, std::vector<double>>& state);

 private:
  struct Stat {
    double mean = 0, var = 0;
    int64_t n = 0;
    void add(double x, double decay);
    double spread() const;
  };
  SpikeOptions o_;
  std::vector<Stat> bins_;
  Stat grad_;
  std::map<std::string, Stat> parts_;
};

}  // namespace vidit
