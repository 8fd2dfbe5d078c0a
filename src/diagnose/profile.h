// A profile of a few training steps with LibTorch's own profiler (Kineto), train.profile_steps:
// every ATen op on the host, and on a GPU every CUDA kernel (NCCL's included), memory copy and
// allocation, with our scopes as user annotations around them: each step ("step N"), its phases,
// each block ("block i") and each wait for a collective ("wait all_gather"; core/trace.h). The
// trace is written per rank as Chrome JSON (ui.perfetto.dev), and the profile is summed into
// where the time went:
//   matmul         matrix products and convolutions (aten::mm / addmm / bmm / _scaled_mm / conv;
//                  GEMM kernels on a GPU)
//   attention      scaled-dot-product attention (its ATen ops; flash / cuDNN / fmha kernels)
//   elementwise    every other op or kernel (norms, activations, copies, the optimizer)
//   communication  our waits for collectives and the engines' own ops (NCCL kernels on a GPU)
//   idle           the rest of the steps' time: on the host, time outside any op (our own code,
//                  data, launches); on a GPU, time with no kernel running.
// On the host each op's own time (its span less its children's) goes to the category of the op,
// or of the nearest enclosing op that has one (the copy inside a matmul is matmul), so the
// categories add up to the steps' time. On a GPU kernels of different streams can overlap
// (communication behind compute): each category sums its kernels, idle is the time none runs.
// The host-only trace (train.trace_steps, core/trace.h) stays: it draws collectives from issue
// to completion, which the profiler does not.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace vidit {

// One profiled event, as the summary needs it.
struct ProfiledEvent {
  std::string name;
  bool device = false;      // a GPU kernel or copy (else a host op or annotation)
  uint64_t thread = 0;      // host thread
  int64_t start_ns = 0, end_ns = 0;
};

// "matmul", "attention", "communication", "elementwise" for an op or kernel; "" for one of our
// annotations (other than a wait, which is communication) and for profiler bookkeeping.
std::string profile_category(const std::string& name, bool device);

struct ProfileSummary {
  double window_s = 0;                          // the profiled steps' time on the host
  std::map<std::string, double> host_s, device_s;  // by category (above), idle included
  int64_t events = 0;
  bool has_device() const { return !device_s.empty(); }
  // "matmul 41%, attention 22%, ..." for host or device time.
  std::string format(bool device) const;
};

// The summary of `events` over the steps: the "step N" annotations on the host say which thread
// ran them and when (their union is the window).
ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events);

// The profiler, started and stopped around the steps (one at a time per process).
class KinetoProfile {
 public:
  // Starts LibTorch's profiler: host ops, and CUDA activity when `cuda`; memory when `memory`.
  KinetoProfile(bool cuda, bool memory);
  ~KinetoProfile();  // stops it, discarding the profile, if stop() was not called
  KinetoProfile(const KinetoProfile&) = delete;
  KinetoProfile& operator=(const KinetoProfile&) = delete;
  // Stops, writes the Chrome trace to `trace_path` (folders created) and sums it up.
  ProfileSummary stop(const std::string& trace_path);

 private:
  bool running_ = false;
};

// The summary as JSON (profile/summary_rank<R>.json).
std::string profile_summary_json(const ProfileSummary& s, int64_t first_step, int64_t last_step);

}  // namespace vidit
