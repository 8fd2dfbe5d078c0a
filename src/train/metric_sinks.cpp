#include "train/metric_sinks.h"

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

}  // namespace vidit
