#include "train/step_windows.h"

#include <cstdio>
#include <fstream>

#include "core/trace.h"
#include "diagnose/profile.h"

namespace vidit {

StepWindows::StepWindows(int64_t first_step, int64_t trace_steps, int64_t profile_steps, std::string out_dir, int rank,
                         bool cuda, bool report)
    : trace_from_(trace_steps > 0 ? first_step + 1 : -1),
      trace_to_(first_step + 1 + trace_steps),
      profile_from_(profile_steps > 0 ? first_step + 1 : -1),
      profile_to_(first_step + 1 + profile_steps),
      out_dir_(std::move(out_dir)),
      rank_(rank),
      cuda_(cuda),
      report_(report),
      last_step_(first_step) {}

StepWindows::~StepWindows() { finish(); }

void StepWindows::before_step(int64_t steps_done) {
  if (steps_done == trace_from_) {
    trace::start(rank_, "rank " + std::to_string(rank_));
    tracing_ = true;
  }
  if (steps_done == profile_from_) profile_ = std::make_unique<KinetoProfile>(cuda_, /*memory=*/true);
}

void StepWindows::after_step(int64_t steps_done) {
  last_step_ = steps_done;
  if (steps_done == trace_to_) finish_trace(steps_done);
  if (steps_done == profile_to_) finish_profile(steps_done);
}

void StepWindows::finish() {
  finish_trace(last_step_);
  finish_profile(last_step_);
}

void StepWindows::finish_trace(int64_t last_step) {
  if (!tracing_) return;
  tracing_ = false;
  trace::stop();
  const std::string path = out_dir_ + "/trace/rank" + std::to_string(rank_) + ".json";
  const size_t n = trace::write(path);
  if (report_)
    std::printf("trace of steps %lld-%lld: %zu events in %s (one file per rank; open in ui.perfetto.dev)\n",
                (long long)trace_from_ + 1, (long long)last_step, n, path.c_str());
}

void StepWindows::finish_profile(int64_t last_step) {
  if (!profile_) return;
  const std::string dir = out_dir_ + "/profile", rank = std::to_string(rank_);
  const ProfileSummary s = profile_->stop(dir + "/rank" + rank + ".json");
  profile_.reset();
  std::ofstream(dir + "/summary_rank" + rank + ".json") << profile_summary_json(s, profile_from_ + 1, last_step) << "\n";
  if (report_)
    std::printf("profile of steps %lld-%lld (rank 0, %.3f s): host %s%s%s; trace in %s/rank%s.json (one per rank; "
                "ui.perfetto.dev)\n",
                (long long)profile_from_ + 1, (long long)last_step, s.window_s, s.format(false).c_str(),
                s.has_device() ? "; GPU " : "", s.has_device() ? s.format(true).c_str() : "", dir.c_str(), rank.c_str());
}

}  // namespace vidit
