#include "diagnose/forensics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "core/storage.h"

namespace vidit {

std::vector<size_t> blamed_samples(const SpikeVerdict& v, const std::vector<StepSample>& samples, double z_threshold) {
  std::vector<size_t> out;
  for (size_t i = 0; i < samples.size(); ++i)
    if (std::isfinite(v.sample_z[i]) ? v.sample_z[i] > z_threshold : !std::isfinite(samples[i].loss)) out.push_back(i);
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) { return v.sample_z[a] > v.sample_z[b]; });
  return out;
}

bool reproduced(const StepSample& s) {
  if (std::isnan(s.rerun_loss)) return false;
  if (!std::isfinite(s.loss)) return !std::isfinite(s.rerun_loss);
  return std::fabs(s.rerun_loss - s.loss) <= 1e-3 * std::fabs(s.loss) + 1e-9;
}

std::string write_forensics(const std::string& out_dir, int64_t step, const SpikeVerdict& v,
                            const std::vector<StepSample>& samples, double grad_norm, double z_threshold,
                            const std::string& action, const std::vector<std::string>& hosts, const nlohmann::json& extra) {
  std::vector<size_t> order(samples.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto z_of = [&](size_t i) { return std::isfinite(v.sample_z[i]) ? v.sample_z[i] : -1e300; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z_of(a) > z_of(b); });
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json rows = nlohmann::json::array(), blamed = nlohmann::json::array();
  for (size_t i : order) {
    const StepSample& s = samples[i];
    nlohmann::json row = {{"sample", s.id},
                          {"rank", s.rank},
                          {"host", size_t(s.rank) < hosts.size() ? hosts[size_t(s.rank)] : ""},
                          {"sigma", s.sigma},
                          {"loss", num(s.loss)},
                          {"baseline", num(v.baseline[i])},
                          {"z", num(v.sample_z[i])}};
    if (!std::isnan(s.rerun_loss)) row["rerun_loss"] = num(s.rerun_loss), row["reproduced"] = reproduced(s);
    if (std::isfinite(v.sample_z[i]) ? v.sample_z[i] > z_threshold : !std::isfinite(s.loss)) blamed.push_back(row);
    rows.push_back(std::move(row));
  }
  nlohmann::json report = {{"step", step},
                           {"why", v.why},
                           {"loss_z", v.loss_z},
                           {"grad_norm", num(grad_norm)},
                           {"grad_z", v.grad_z},
                           {"threshold", z_threshold},
                           {"action", action},
                           {"judged_samples", v.judged},
                           {"blamed", blamed},
                           {"samples", rows}};
  report.update(extra);
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.json", (long long)step);
  const std::filesystem::path dir = std::filesystem::path(out_dir) / "forensics";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  local_storage().write_atomic(path, report.dump(2) + "\n");
  return path;
}

std::string describe_blamed(const nlohmann::json& report) {
  std::string out;
  for (const auto& b : report.value("blamed", nlohmann::json::array())) {
    const nlohmann::json& id = b.at("sample");
    std::string who;
    if (id.is_object() && id.contains("source")) who = id.at("source").get<std::string>() + " (" + id.value("key", "") + ")";
    else if (id.is_object() && id.contains("key")) who = id.at("key").get<std::string>();
    else if (id.is_object() && id.contains("index")) who = "sample " + std::to_string(id.at("index").get<int64_t>());
    else who = "a sample";
    char z[48];
    std::snprintf(z, sizeof z, "z %.1f", b.at("z").is_number() ? b.at("z").get<double>() : NAN);
    out += (out.empty() ? "" : "; ") + who + " on rank " + std::to_string(b.at("rank").get<int>()) + " (" + z + ")";
  }
  return out.empty() ? "no single sample stands out" : out;
}

}  // namespace vidit
