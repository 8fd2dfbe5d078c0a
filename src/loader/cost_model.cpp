#include "loader/cost_model.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "model/model_info.h"

namespace vidit {
namespace {

std::string list_tokens(const std::set<int64_t>& tokens) {
  std::string s;
  for (int64_t t : tokens) s += (s.empty() ? "" : ", ") + std::to_string(t);
  return s;
}

// Solves the n x n system A x = b (row-major) by Gaussian elimination with partial pivoting;
// false when A is singular (a pivot below 1e-12 of the largest entry).
bool solve(std::vector<double> A, std::vector<double> b, size_t n, std::vector<double>& x) {
  double biggest = 0;
  for (double v : A) biggest = std::max(biggest, std::abs(v));
  if (biggest == 0) return false;
  for (size_t k = 0; k < n; ++k) {
    size_t p = k;
    for (size_t i = k + 1; i < n; ++i)
      if (std::abs(A[i * n + k]) > std::abs(A[p * n + k])) p = i;
    if (std::abs(A[p * n + k]) < 1e-12 * biggest) return false;
    for (size_t j = 0; j < n; ++j) std::swap(A[k * n + j], A[p * n + j]);
    std::swap(b[k], b[p]);
    for (size_t i = k + 1; i < n; ++i) {
      const double f = A[i * n + k] / A[k * n + k];
      for (size_t j = k; j < n; ++j) A[i * n + j] -= f * A[k * n + j];
      b[i] -= f * b[k];
    }
  }
  x.assign(n, 0);
  for (size_t k = n; k-- > 0;) {
    double s = b[k];
    for (size_t j = k + 1; j < n; ++j) s -= A[k * n + j] * x[j];
    x[k] = s / A[k * n + k];
  }
  return true;
}

}  // namespace

CostEstimate CostModel::estimate(int64_t tokens) const {
  CostEstimate e;
  e.cost = cost(tokens);
  if (measured_tokens.empty()) {
    e.note = "predicted from the model's shape (" + unit + "; no measurements)";
  } else if (measured_tokens.count(tokens)) {
    e.measured = true;
    e.note = "measured";
  } else {
    e.note = "not measured: predicted by the formula fitted to samples of " + list_tokens(measured_tokens) + " tokens";
  }
  return e;
}

CostModel cost_model_for(const Config& c) {
  // model_info() counts the FLOPs of a sample of data.latent_* : give it samples of L tokens (L
  // patches along time) at three L and read the quadratic's coefficients off exactly.
  const double L1 = 1, step = 1024;
  double f[3];
  for (int i = 0; i < 3; ++i) {
    Config one = c;
    one.data.latent_frames = c.model.patch[0] * int64_t(L1 + step * i);
    one.data.latent_height = c.model.patch[1];
    one.data.latent_width = c.model.patch[2];
    f[i] = model_info(one).train_flops;
  }
  CostModel m;
  m.per_token_pair = (f[2] - 2 * f[1] + f[0]) / (2 * step * step);
  m.per_token = (f[1] - f[0]) / step - m.per_token_pair * (2 * L1 + step);
  m.fixed = f[0] - m.per_token * L1 - m.per_token_pair * L1 * L1;
  std::ostringstream o;
  o << "training FLOPs from the model's shape (dim " << c.model.dim << ", ffn_dim " << c.model.ffn_dim << ", "
    << c.model.layers << " layers, text_len " << c.model.text_len << ")";
  m.origin = o.str();
  return m;
}

CostModel fit_cost_model(const std::vector<CostMeasurement>& ms, const CostModel& formula) {
  VIDIT_CHECK(!ms.empty(), "cost model fit: no measurements; time at least one batch per bucket first");
  std::set<int64_t> tokens;
  for (size_t i = 0; i < ms.size(); ++i) {
    const CostMeasurement& m = ms[i];
    VIDIT_CHECK(m.tokens > 0 && m.samples > 0 && m.seconds > 0 && std::isfinite(m.seconds), "cost model fit: measurement ",
                i, " (bucket '", m.bucket, "': ", m.samples, " samples of ", m.tokens, " tokens in ", m.seconds,
                " s) needs positive tokens, samples and seconds; drop it");
    tokens.insert(m.tokens);
  }
  // The formula's three terms, grouped into `g` columns that each get one scale.
  auto columns = [&](size_t g, double L) -> std::vector<double> {
    const double t0 = formula.fixed, t1 = formula.per_token * L, t2 = formula.per_token_pair * L * L;
    if (g == 3) return {t0, t1, t2};
    if (g == 2) return {t0 + t1, t2};
    return {t0 + t1 + t2};
  };
  for (size_t g = std::min<size_t>(3, tokens.size()); g >= 1; --g) {
    // Relative error: each row divided by its measured per-sample time; columns normalised.
    std::vector<std::vector<double>> rows;
    std::vector<double> norm(g, 0);
    for (const auto& m : ms) {
      std::vector<double> r = columns(g, double(m.tokens));
      const double y = m.seconds / double(m.samples);
      for (size_t j = 0; j < g; ++j) r[j] /= y, norm[j] = std::max(norm[j], std::abs(r[j]));
      rows.push_back(r);
    }
    bool zero_column = false;
    for (double n : norm) zero_column |= n == 0;
    if (zero_column) continue;
    std::vector<double> A(g * g, 0), b(g, 0), x;
    for (const auto& r : rows)
      for (size_t i = 0; i < g; ++i) {
        b[i] += r[i] / norm[i];  // target 1 (measured / measured)
        for (size_t j = 0; j < g; ++j) A[i * g + j] += r[i] / norm[i] * r[j] / norm[j];
      }
    if (!solve(A, b, g, x)) continue;
    bool negative = false;
    for (size_t j = 0; j < g; ++j) x[j] /= norm[j], negative |= !(x[j] > 0);
    if (negative && g > 1) continue;
    VIDIT_CHECK(!negative, "cost model fit: the measured times do not grow with the formula's cost (scale ", x[0],
                "); check that the measurements are of this model");
    CostModel fit;
    fit.unit = "s";
    fit.fixed = formula.fixed * x[0];
    fit.per_token = formula.per_token * (g == 3 ? x[1] : x[0]);
    fit.per_token_pair = formula.per_token_pair * x[g - 1];
    fit.measured_tokens = tokens;
    std::ostringstream o;
    o << "seconds fitted to " << ms.size() << " measured batches (samples of " << list_tokens(tokens)
      << " tokens), " << g << (g == 1 ? " scale" : " scales") << " of the formula";
    fit.origin = o.str();
    return fit;
  }
  fail("cost model fit: the formula's terms are all zero; build it with cost_model_for(config) first");
}

std::vector<CostCheck> compare_cost_model(const CostModel& model, const std::vector<CostMeasurement>& ms) {
  std::vector<CostCheck> out;
  std::map<std::string, size_t> at;
  double sum_measured = 0, sum_predicted = 0;
  for (const auto& m : ms) {
    auto [it, fresh] = at.emplace(m.bucket, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().bucket = m.bucket;
      out.back().tokens = m.tokens;
    }
    CostCheck& c = out[it->second];
    VIDIT_CHECK(c.tokens == m.tokens, "cost model check: bucket '", m.bucket, "' measured with ", c.tokens, " and ",
                m.tokens, " tokens per sample; a bucket has one shape");
    c.samples += m.samples;
    c.measured_s += m.seconds;
    sum_measured += m.seconds;
    sum_predicted += model.cost(m.tokens) * double(m.samples);
  }
  const double scale = model.unit == "s" || sum_predicted <= 0 ? 1.0 : sum_measured / sum_predicted;
  for (auto& c : out) {
    c.measured_s /= double(std::max<int64_t>(1, c.samples));
    c.estimate = model.estimate(c.tokens);
    c.predicted = c.estimate.cost;
    c.ratio = c.predicted > 0 ? c.measured_s / (scale * c.predicted) : 0;
  }
  return out;
}

std::string format_cost_checks(const CostModel& model, const std::vector<CostCheck>& checks) {
  std::string s = "cost model: " + model.origin + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-16s %8s %8s %14s %14s %9s\n", "bucket", "tokens", "samples", "measured s/smp",
                ("predicted " + model.unit).c_str(), "meas/pred");
  s += line;
  for (const auto& c : checks) {
    std::snprintf(line, sizeof line, "  %-16s %8lld %8lld %14.6g %14.6g %9.3f\n", c.bucket.c_str(), (long long)c.tokens,
                  (long long)c.samples, c.measured_s, c.predicted, c.ratio);
    s += line;
  }
  if (model.unit != "s") s += "  (meas/pred after one common scale: 1.000 = time in proportion to the prediction)\n";
  return s;
}

}  // namespace vidit
