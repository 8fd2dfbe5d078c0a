// Per-step training metrics: one JSON object per line in <out_dir>/metrics.jsonl and a
// readable console line with a progress bar and ETA.
#pragma once
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vidit {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, grad_norm = 0, lr = 0, step_seconds = 0;
  double samples_per_s = 0, tokens_per_s = 0, tflops = 0;  // achieved TFLOP/s (all ranks)
  double data_wait_s = 0;  // waiting for batches (a loader that keeps up makes this ~0)
  double mfu = -1;  // tflops over the devices' peak (-1: peak unknown, e.g. on the CPU)
  double comm_wait_s = -1;  // this rank's time blocked in collectives (-1: one process, nothing to wait for)
  // Distributed: the rank that computed longest this step (step time minus time blocked in
  // collectives: a slow node makes the others wait, so it is busiest), and the median over ranks.
  int slowest_rank = -1;
  double slowest_busy_s = 0, median_busy_s = 0;
  std::string slowest_host;    // its host
  double slowest_score = 1;    // median / its busy time (diagnose/stragglers.h)
};

// One validation (train/validation.h): the held-out clips' mean flow-matching loss at the fixed
// noise levels, overall, per noise level and per bucket. A line of its own in metrics.jsonl,
// {"step", "val_loss", "val_loss_by_sigma", "val_loss_by_bucket", "val_clips", "val_seconds"}.
struct ValidationMetrics {
  int64_t step = 0;
  int64_t clips = 0;  // clips evaluated (each at every noise level)
  double loss = 0;    // mean over clips and noise levels
  std::vector<std::pair<double, double>> by_sigma;  // (sigma, mean loss over the clips)
  std::map<std::string, double> by_bucket;          // bucket -> mean loss over its clips and the noise levels
  double seconds = 0;
};

class MetricsLogger {
 public:
  // `jsonl_path` empty: console only. `append`: continue an existing file (resume).
  // `append`: continue the file of a resumed run, dropping the lines of steps after
  // `resumed_step` (logged by the run that stopped, and about to be trained again), so a restart
  // leaves each step once.
  MetricsLogger(const std::string& jsonl_path, bool append, bool console = true, int64_t resumed_step = -1);
  void log(const StepMetrics& m);
  void log_validation(const ValidationMetrics& v);

 private:
  std::ofstream jsonl_;
  bool console_;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = -1;
};

}  // namespace vidit
