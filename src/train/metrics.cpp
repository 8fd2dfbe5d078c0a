#include "train/metrics.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "core/safetensors.h"

namespace vidit {

MetricsLogger::MetricsLogger(const std::string& path, bool append, bool console, int64_t resumed_step)
    : console_(console), start_(std::chrono::steady_clock::now()) {
  if (path.empty()) return;
  if (append && resumed_step >= 0) {
    std::ifstream in(path);
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (the run was killed while writing it) goes too.
      if (j.is_discarded() || !j.contains("step") || j["step"].get<int64_t>() > resumed_step) {
        dropped = true;
        continue;
      }
      kept += line + "\n";
    }
    if (dropped) write_file_atomic(path, kept);
  }
  jsonl_.open(path, append ? std::ios::app : std::ios::trunc);
}

void MetricsLogger::log_validation(const ValidationMetrics& v) {
  if (jsonl_.is_open()) {
    nlohmann::json sig = nlohmann::json::object();
    char name[32];
    for (const auto& [sigma, loss] : v.by_sigma) {
      std::snprintf(name, sizeof name, "%.4g", sigma);
      sig[name] = loss;
    }
    nlohmann::json j = {{"step", v.step}, {"val_loss", v.loss}, {"val_loss_by_sigma", sig},
                        {"val_loss_by_bucket", v.by_bucket}, {"val_clips", v.clips}, {"val_seconds", v.seconds}};
    jsonl_ << j.dump() << "\n";
    jsonl_.flush();
  }
  if (!console_) return;
  std::string bands;
  char buf[64];
  for (const auto& [sigma, loss] : v.by_sigma) {
    std::snprintf(buf, sizeof buf, "%s%.2g: %.4f", bands.empty() ? "" : ", ", sigma, loss);
    bands += buf;
  }
  std::printf("[val] step %lld: loss %.4f over %lld held-out clips (sigma %s) in %.1f s\n", (long long)v.step, v.loss,
              (long long)v.clips, bands.c_str(), v.seconds);
  std::fflush(stdout);
}

void MetricsLogger::log(const StepMetrics& m) {
  if (first_step_ < 0) first_step_ = m.step - 1, start_ = std::chrono::steady_clock::now() -
                                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                            std::chrono::duration<double>(m.step_seconds));
  if (jsonl_.is_open()) {
    nlohmann::json j = {{"step", m.step},           {"loss", m.loss},
                        {"grad_norm", m.grad_norm}, {"lr", m.lr},
                        {"step_time_s", m.step_seconds}, {"samples_per_s", m.samples_per_s},
                        {"tokens_per_s", m.tokens_per_s}, {"tflops", m.tflops}};
    j["data_wait_s"] = m.data_wait_s;
    if (m.mfu >= 0) j["mfu"] = m.mfu;
    if (m.comm_wait_s >= 0) j["comm_wait_s"] = m.comm_wait_s;
    if (m.slowest_rank >= 0)
      j["slowest_rank"] = m.slowest_rank, j["slowest_busy_s"] = m.slowest_busy_s, j["median_busy_s"] = m.median_busy_s,
      j["slowest_host"] = m.slowest_host, j["slowest_score"] = m.slowest_score;
    jsonl_ << j.dump() << "\n";
    jsonl_.flush();
  }
  if (!console_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = m.step - first_step_, left = m.total_steps - m.step;
  const double eta = done > 0 ? elapsed / double(done) * double(left) : 0;
  const int width = 20;
  const int filled = m.total_steps > 0 ? int(width * m.step / m.total_steps) : 0;
  std::string bar(filled, '#');
  bar.append(width - filled, '-');
  char comm[96] = "";
  if (m.comm_wait_s >= 0 && m.step_seconds > 0) {
    int n = std::snprintf(comm, sizeof comm, " | comm wait %.0f%%", 100.0 * m.comm_wait_s / m.step_seconds);
    // A straggler: one rank computing 20% (and 50 ms) longer than the median rank.
    if (m.slowest_rank >= 0 && m.median_busy_s > 0 && m.slowest_busy_s > 1.2 * m.median_busy_s &&
        m.slowest_busy_s > m.median_busy_s + 0.05)
      std::snprintf(comm + n, sizeof comm - size_t(n), " | rank %d slow (+%.0f%%)", m.slowest_rank,
                    100.0 * (m.slowest_busy_s / m.median_busy_s - 1));
  }
  char data[32] = "";
  // The loader falling behind: more than 5% of the step spent waiting for the batch.
  if (m.step_seconds > 0 && m.data_wait_s > 0.05 * m.step_seconds)
    std::snprintf(data, sizeof data, " | data wait %.0f%%", 100.0 * m.data_wait_s / m.step_seconds);
  char mfu[32] = "";
  if (m.mfu >= 0) std::snprintf(mfu, sizeof mfu, " (MFU %.1f%%)", 100.0 * m.mfu);
  std::printf("step %6lld/%lld [%s] loss %.4f | gnorm %.3f | lr %.2e | %.3f s/step%s%s | %.1f samples/s"
              " | %.0f tok/s | %.4f TFLOP/s%s | ETA %s\n",
              (long long)m.step, (long long)m.total_steps, bar.c_str(), m.loss, m.grad_norm, m.lr,
              m.step_seconds, data, comm, m.samples_per_s, m.tokens_per_s, m.tflops, mfu, short_duration(eta).c_str());
  std::fflush(stdout);
}

}  // namespace vidit
