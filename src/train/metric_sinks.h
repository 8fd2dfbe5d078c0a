// Where a run's records go, behind one interface. Rank 0 hands every record to its sinks; a new
// sink (a cluster's metrics service, say) is one class, with no branch in the loop.
//   MetricsFileSink   <out_dir>/metrics.jsonl and the console line, per logged step and validation
//                     (train/metrics.h)
//   TensorBoardSink   TensorBoard scalars and histograms (train/tensorboard.h)
//   EventsFileSink    <out_dir>/events.jsonl, the run's diagnostic events (diagnose/events.h)
//   SavesFileSink     <out_dir>/saves.jsonl and the console line, per committed checkpoint
// RunSinks fans a record out. It holds two kinds: the run's record sinks (events, saves), kept
// for the Trainer's life because events come before fit() (the start, a resume) and after it
// (the finish); and the step sinks (metrics, TensorBoard), opened by each fit() and reopened
// after a rollback at the step it returned to. Events may come from the watchdog's thread (a
// hang), so RunSinks serialises every call.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "diagnose/events.h"
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
  // A logged step (every train.log_every steps, and the last).
  virtual void step(const LoggedStep& s) {}
  // A step whose update was skipped, or that spiked (loss_z: how far its loss lay out).
  virtual void health(int64_t step, bool skipped, double loss_z) {}
  // One line of the run's diagnostic record: "event", "step", "time" and its fields.
  virtual void event(const nlohmann::json& line) {}
  // A checkpoint committed.
  virtual void saved(const SaveOutcome& s) {}
  // A validation loss (train/validation.h).
  virtual void validation(const ValidationMetrics& v) {}
};

class MetricsFileSink : public MetricSink {
 public:
  explicit MetricsFileSink(std::unique_ptr<MetricsLogger> logger) : logger_(std::move(logger)) {}
  void step(const LoggedStep& s) override { logger_->log(s.metrics); }
  void validation(const ValidationMetrics& v) override { logger_->log_validation(v); }

 private:
  std::unique_ptr<MetricsLogger> logger_;
};

class TensorBoardSink : public MetricSink {
 public:
  explicit TensorBoardSink(TensorBoardWriter& tb) : tb_(tb) {}
  void step(const LoggedStep& s) override;
  void health(int64_t step, bool skipped, double loss_z) override;
  void saved(const SaveOutcome& s) override;  // checkpoint/pause_s and checkpoint/write_s
  void validation(const ValidationMetrics& v) override;  // val/loss, val/loss_by_sigma/*, val/loss_by_bucket/*

 private:
  TensorBoardWriter& tb_;
};

// events.jsonl, opened at the first event (a run that has none leaves no file).
class EventsFileSink : public MetricSink {
 public:
  explicit EventsFileSink(std::string out_dir) : out_dir_(std::move(out_dir)) {}
  void event(const nlohmann::json& line) override;

 private:
  std::string out_dir_;
  std::unique_ptr<EventLog> file_;
};

// saves.jsonl: step, pause, write time, bytes, async and directory per committed save; with
// `console`, a line saying the same.
class SavesFileSink : public MetricSink {
 public:
  SavesFileSink(std::string out_dir, bool async, const bool& console)
      : out_dir_(std::move(out_dir)), async_(async), console_(console) {}
  void saved(const SaveOutcome& s) override;

 private:
  std::string out_dir_;
  bool async_;
  const bool& console_;  // the Trainer's: fit(console) sets it
};

class RunSinks {
 public:
  void keep(std::unique_ptr<MetricSink> sink);                        // for the run's life
  void open_steps(std::vector<std::unique_ptr<MetricSink>> sinks);  // replaces the step sinks
  bool has_step_sinks() const;
  void step(const LoggedStep& s);
  void health(int64_t step, bool skipped, double loss_z);
  void event(const nlohmann::json& line);
  void saved(const SaveOutcome& s);
  void validation(const ValidationMetrics& v);

 private:
  template <typename F>
  void each(F f);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricSink>> kept_, steps_;
};

}  // namespace vidit
