// Where a run's logged steps go, behind one interface: fit() makes one LoggedStep every
// train.log_every steps (rank 0) and hands it to every sink; a new sink (a cluster's metrics
// service, say) is one class, with no branch in the loop.
//   MetricsFileSink   <out_dir>/metrics.jsonl and the console line (train/metrics.h)
//   TensorBoardSink   TensorBoard scalars and histograms (train/tensorboard.h)
// (The run's events go to events.jsonl through diagnose/events.h, its saves to saves.jsonl
// through checkpoint/checkpointer.h.)
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "train/metrics.h"

namespace vidit {

class TensorBoardWriter;

struct LoggedStep {
  StepMetrics metrics;
  std::vector<double> sample_losses;             // rank 0's samples of the step
  std::map<std::string, double> loss_by_bucket;  // rank 0's micro-batches since the last logged step
  double host_heap_gib = 0;
  double device_peak_gib = -1;  // since the last logged step (-1: not on a GPU)
};

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void step(const LoggedStep& s) = 0;
  // A step whose update was skipped, or that spiked (loss_z: how far its loss lay out).
  virtual void health(int64_t step, bool skipped, double loss_z) {}
};

class MetricsFileSink : public MetricSink {
 public:
  explicit MetricsFileSink(std::unique_ptr<MetricsLogger> logger) : logger_(std::move(logger)) {}
  void step(const LoggedStep& s) override { logger_->log(s.metrics); }

 private:
  std::unique_ptr<MetricsLogger> logger_;
};

class TensorBoardSink : public MetricSink {
 public:
  explicit TensorBoardSink(TensorBoardWriter& tb) : tb_(tb) {}
  void step(const LoggedStep& s) override;
  void health(int64_t step, bool skipped, double loss_z) override;

 private:
  TensorBoardWriter& tb_;
};

}  // namespace vidit
