// A recorder of Chrome trace events, to see what one process does during a few training steps:
// the step's phases, each FSDP block's forward and backward, every collective from the moment
// it is issued to the end of its wait, and the waits themselves (the communication that compute
// did not hide). The file opens in ui.perfetto.dev or chrome://tracing; train.trace_steps turns
// it on (train/trainer.h), one file per rank.
//
// Process-wide and off by default: every recording call first reads one atomic flag, so leaving
// the calls in the step costs nothing measurable. Timestamps are microseconds of the steady
// clock since the process first used the recorder; slices are drawn on the track of the thread
// that recorded them, asynchronous ones (a collective in flight) on a track of their own.
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace vidit::trace {

namespace detail {
extern std::atomic<bool> recording;
}

// Numeric arguments shown with a slice (e.g. {"bytes", 4096}).
using Args = std::initializer_list<std::pair<const char*, double>>;

inline bool on() { return detail::recording.load(std::memory_order_relaxed); }
// Starts recording, dropping earlier events; `pid` labels this process's tracks (the rank).
void start(int pid, const std::string& process_name);
void stop();
double now_us();

// A slice [ts, ts + dur) on the calling thread's track.
void slice(const std::string& name, const char* category, double ts_us, double dur_us, Args args = {});
// A slice on its own track (overlapping ones stack), e.g. a collective from issue to completion.
void async_slice(const std::string& name, const char* category, double ts_us, double dur_us, Args args = {});

// Writes the events recorded since start() as {"traceEvents": [...]} to `path` (folders created).
// Returns the number of events written.
size_t write(const std::string& path);

// Annotations for LibTorch's profiler (diagnose/profile.h): while it profiles, a scope shows in
// its trace as a user annotation around the ATen ops and CUDA kernels inside it. On a CUDA
// build each is also an NVTX range, and VIDIT_NVTX=1 keeps them on for the whole run, for Nsight
// Systems. Off otherwise (one atomic load).
namespace detail {
extern std::atomic<bool> annotating;
void* begin_annotation(const char* name, int64_t index);
void end_annotation(void* a);
}  // namespace detail
inline bool annotating() { return detail::annotating.load(std::memory_order_relaxed); }
void set_annotating(bool on);

// A user annotation named `name` (or "name index" with an index >= 0) from construction to
// destruction, on the constructing thread.
class Annotation {
 public:
  explicit Annotation(const char* name, int64_t index = -1)
      : a_(annotating() ? detail::begin_annotation(name, index) : nullptr) {}
  ~Annotation() {
    if (a_) detail::end_annotation(a_);
  }
  Annotation(const Annotation&) = delete;
  Annotation& operator=(const Annotation&) = delete;

 private:
  void* a_;
};

// A slice from construction to destruction (recorded only if the recorder was on at construction),
// and an annotation while the profiler runs.
class Span {
 public:
  Span(std::string name, const char* category) : name_(std::move(name)), category_(category),
                                                 start_(on() ? now_us() : -1), annotation_(name_.c_str()) {}
  ~Span() {
    if (start_ >= 0) slice(name_, category_, start_, now_us() - start_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  const char* category_;
  double start_;
  Annotation annotation_;
};

}  // namespace vidit::trace
