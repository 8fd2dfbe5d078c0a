#include "train/metric_sinks.h"

#include <cstdio>
#include <fstream>

#include "train/tensorboard.h"

namespace vidit {

void TensorBoardSink::step(const LoggedStep& s) {
  const int64_t step = s.metrics.step;
  tb_.add_step_metrics(s.metrics);
  tb_.add_histogram("train/sample_loss", step, s.sample_losses);
  for (const auto& [bucket, loss] : s.loss_by_bucket) tb_.add_scalar("train/loss_by_bucket/" + bucket, step, loss);
  tb_.add_scalar("memory/host_heap_gib", step, s.host_heap_gib);
  if (s.device_peak_gib >= 0) tb_.add_scalar("memory/device_peak_gib", step, s.device_peak_gib);
}

void TensorBoardSink::health(int64_t step, bool skipped, double loss_z) {
  tb_.add_scalar("health/skipped_update", step, skipped ? 1 : 0);
  tb_.add_scalar("health/spike_loss_z", step, loss_z);
}

void TensorBoardSink::saved(const SaveOutcome& s) {
  tb_.add_scalar("checkpoint/pause_s", s.step, s.blocked_s);
  tb_.add_scalar("checkpoint/write_s", s.step, s.write_s);
}

void TensorBoardSink::validation(const ValidationMetrics& v) {
  tb_.add_scalar("val/loss", v.step, v.loss);
  char tag[64];
  for (const auto& [sigma, loss] : v.by_sigma) {
    std::snprintf(tag, sizeof tag, "val/loss_by_sigma/%.2f", sigma);
    tb_.add_scalar(tag, v.step, loss);
  }
  for (const auto& [bucket, loss] : v.by_bucket) tb_.add_scalar("val/loss_by_bucket/" + bucket, v.step, loss);
}

void EventsFileSink::event(const nlohmann::json& line) {
  if (!file_) file_ = std::make_unique<EventLog>(out_dir_);
  file_->append(line);
}

void SavesFileSink::saved(const SaveOutcome& s) {
  if (console_)
    std::printf("checkpoint step %lld: training paused %.3f s, written in %.2f s in the background "
                "(%.1f MB by %d rank(s), %.0f MB/s) -> %s\n",
                (long long)s.step, s.blocked_s, s.write_s, s.bytes / 1e6, s.writers,
                s.write_s > 0 ? s.bytes / 1e6 / s.write_s : 0.0, s.dir.c_str());
  std::ofstream log(out_dir_ + "/saves.jsonl", std::ios::app);
  log << nlohmann::json{{"step", s.step},          {"blocked_s", s.blocked_s}, {"write_s", s.write_s},
                        {"bytes", int64_t(s.bytes)}, {"async", async_},          {"dir", s.dir}}
             .dump()
      << "\n";
}

void RunSinks::keep(std::unique_ptr<MetricSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.push_back(std::move(sink));
}

void RunSinks::open_steps(std::vector<std::unique_ptr<MetricSink>> sinks) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_ = std::move(sinks);
}

bool RunSinks::has_step_sinks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !steps_.empty();
}

template <typename F>
void RunSinks::each(F f) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : kept_) f(*s);
  for (auto& s : steps_) f(*s);
}

void RunSinks::step(const LoggedStep& s) { each([&](MetricSink& k) { k.step(s); }); }
void RunSinks::health(int64_t step, bool skipped, double loss_z) {
  each([&](MetricSink& k) { k.health(step, skipped, loss_z); });
}
void RunSinks::event(const nlohmann::json& line) { each([&](MetricSink& k) { k.event(line); }); }
void RunSinks::saved(const SaveOutcome& s) { each([&](MetricSink& k) { k.saved(s); }); }
void RunSinks::validation(const ValidationMetrics& v) { each([&](MetricSink& k) { k.validation(v); }); }

}  // namespace vidit
