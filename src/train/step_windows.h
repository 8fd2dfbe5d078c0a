// The trace and profile windows of a run: fit() tells it where each step begins and ends, and it
// starts and stops the recorders. Both leave out the run's first step (allocations, first
// gathers) and record the next train.trace_steps / train.profile_steps steps:
//   trace    core/trace.h's spans, to <out_dir>/trace/rank<R>.json;
//   profile  LibTorch's Kineto profiler (diagnose/profile.h), to <out_dir>/profile/rank<R>.json
//            and its summary by category to profile/summary_rank<R>.json.
// Every rank records its own; `report` (rank 0, console on) prints one line per window.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace vidit {

class KinetoProfile;

class StepWindows {
 public:
  // `first_step`: the step the run starts after (0, or the step resumed from).
  StepWindows(int64_t first_step, int64_t trace_steps, int64_t profile_steps, std::string out_dir, int rank,
              bool cuda, bool report);
  ~StepWindows();  // finish()
  void before_step(int64_t steps_done);  // a window that begins with the next step starts
  void after_step(int64_t steps_done);   // a window that ended with this step is written
  void finish();                          // the run ends: whatever is open is written

 private:
  void finish_trace(int64_t last_step);
  void finish_profile(int64_t last_step);
  int64_t trace_from_, trace_to_, profile_from_, profile_to_;
  std::string out_dir_;
  int rank_;
  bool cuda_, report_;
  bool tracing_ = false;
  int64_t last_step_;
  std::unique_ptr<KinetoProfile> profile_;
};

}  // namespace vidit
