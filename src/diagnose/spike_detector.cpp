#include "diagnose/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vidit {

void SpikeDetector::Stat::add(double x, double decay) {
  // A plain average while few values were seen (weight 1/(n+1) for the new one), then an
  // exponential one.
  const double w = std::max(1.0 - decay, 1.0 / double(n + 1));
  if (n == 0) {
    mean = x, var = 0;
  } else {
    const double d = x - mean;
    mean += w * d;
    var = (1 - w) * (var + w * d * d);
  }
  ++n;
}

double SpikeDetector::Stat::spread() const {
  // A floor, so that a bin whose losses happened to be equal does not flag the next one.
  return std::sqrt(var) + 1e-3 * std::fabs(mean) + 1e-12;
}

SpikeDetector::SpikeDetector(SpikeOptions o) : o_(o), bins_(size_t(std::max<int64_t>(1, o.bins))) {}

int64_t SpikeDetector::bin_of(double sigma) const {
  const int64_t n = int64_t(bins_.size());
  return std::clamp<int64_t>(int64_t(std::floor(sigma * double(n))), 0, n - 1);
}

SpikeVerdict SpikeDetector::observe(const std::vector<SampleLoss>& samples, double grad_norm) {
  SpikeVerdict v;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double sum_z = 0;
  for (const SampleLoss& s : samples) {
    const Stat& b = bins_[size_t(bin_of(s.sigma))];
    if (b.n >= o_.warmup && std::isfinite(s.loss)) {
      const double z = (s.loss - b.mean) / b.spread();
      v.sample_z.push_back(z), v.baseline.push_back(b.mean);
      sum_z += z, ++v.judged;
    } else {
      v.sample_z.push_back(nan), v.baseline.push_back(nan);
    }
  }
  if (v.judged > 0) v.loss_z = sum_z / std::sqrt(double(v.judged));
  const bool finite_norm = std::isfinite(grad_norm) && grad_norm > 0;
  if (finite_norm && grad_.n >= o_.warmup) v.grad_z = (std::log(grad_norm) - grad_.mean) / grad_.spread();
  const bool loss_spike = v.loss_z > o_.z, grad_spike = v.grad_z > o_.z;
  v.spike = loss_spike || grad_spike;
  v.why = loss_spike && grad_spike ? "loss and gradient norm" : loss_spike ? "loss" : grad_spike ? "gradient norm" : "";
  if (!v.spike) {
    for (const SampleLoss& s : samples)
      if (std::isfinite(s.loss)) bins_[size_t(bin_of(s.sigma))].add(s.loss, o_.decay);
    if (finite_norm) grad_.add(std::log(grad_norm), o_.decay);
  }
  return v;
}

std::vector<PartNorm> SpikeDetector::parts(const std::map<std::string, double>& norms, bool learn) {
  std::vector<PartNorm> out;
  for (const auto& [part, norm] : norms) {
    Stat& st = parts_[part];
    PartNorm p{part, norm, st.n >= o_.warmup ? std::exp(st.mean) : 0.0, 0.0};
    if (p.typical > 0) p.ratio = norm / p.typical;
    out.push_back(p);
    if (learn && std::isfinite(norm) && norm > 0) st.add(std::log(norm), o_.decay);
  }
  std::stable_sort(out.begin(), out.end(), [](const PartNorm& a, const PartNorm& b) { return a.ratio > b.ratio; });
  return out;
}

std::map<std::string, std::vector<double>> SpikeDetector::state() const {
  auto put = [](std::vector<double>& out, const Stat& st) { out.insert(out.end(), {st.mean, st.var, double(st.n)}); };
  std::map<std::string, std::vector<double>> out;
  for (const Stat& b : bins_) put(out["bins"], b);
  put(out["grad"], grad_);
  for (const auto& [part, st] : parts_) put(out["part." + part], st);
  return out;
}

bool SpikeDetector::set_state(const std::map<std::string, std::vector<double>>& state) {
  auto get = [](const std::vector<double>& v, size_t i) { return Stat{v[3 * i], v[3 * i + 1], int64_t(v[3 * i + 2])}; };
  auto bins = state.find("bins"), grad = state.find("grad");
  if (bins == state.end() || grad == state.end() || bins->second.size() != 3 * bins_.size() || grad->second.size() != 3)
    return false;
  for (size_t i = 0; i < bins_.size(); ++i) bins_[i] = get(bins->second, i);
  grad_ = get(grad->second, 0);
  parts_.clear();
  for (const auto& [key, v] : state)
    if (key.rfind("part.", 0) == 0 && v.size() == 3) parts_[key.substr(5)] = get(v, 0);
  return true;
}

}  // namespace vidit
