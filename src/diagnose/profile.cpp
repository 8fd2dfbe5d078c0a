#include "diagnose/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/trace.h"

namespace vidit {
namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* const kCategories[] = {"matmul", "attention", "elementwise", "communication", "idle"};

// The union of [start, end) intervals, in ns.
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, end = INT64_MIN;
  for (const auto& [a, b] : spans) {
    if (b <= end) continue;
    total += b - std::max(a, end);
    end = b;
  }
  return total;
}

bool is_step(const ProfiledEvent& e) { return !e.device && e.name.rfind("step ", 0) == 0; }

}  // namespace

std::string profile_category(const std::string& name, bool device) {
  const std::string n = lower(name);
  if (device) {
    if (contains(n, "nccl")) return "communication";
    if (contains(n, "flash") || contains(n, "fmha") || contains(n, "attention") || contains(n, "sdpa") ||
        contains(n, "cudnn_generated_fort_native_sdpa"))
      return "attention";
    if (contains(n, "gemm") || contains(n, "gemv") || contains(n, "cutlass") || contains(n, "cublas") ||
        contains(n, "nvjet") || contains(n, "xmma") || contains(n, "conv"))
      return "matmul";
    return "elementwise";
  }
  if (n.rfind("wait", 0) == 0 || n.rfind("c10d::", 0) == 0 || n.rfind("gloo:", 0) == 0 || n.rfind("nccl:", 0) == 0 ||
      n.rfind("mpi:", 0) == 0)
    return "communication";
  if (n.rfind("aten::", 0) != 0) return "";  // our annotations, profiler bookkeeping
  if (contains(n, "scaled_dot_product") || contains(n, "flash_attention") || contains(n, "efficient_attention") ||
      contains(n, "cudnn_attention"))
    return "attention";
  static const std::set<std::string> matmul = {
      "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm",
      "aten::addmv", "aten::mv", "aten::dot", "aten::convolution", "aten::_convolution", "aten::conv3d",
      "aten::conv2d", "aten::mkldnn_convolution", "aten::convolution_backward", "aten::_scaled_mm_out"};
  if (matmul.count(n)) return "matmul";
  return "elementwise";
}

ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events) {
  ProfileSummary s;
  s.events = int64_t(events.size());
  // The steps: their thread and their union.
  std::map<uint64_t, int64_t> step_time_by_thread;
  for (const auto& e : events)
    if (is_step(e)) step_time_by_thread[e.thread] += e.end_ns - e.start_ns;
  if (step_time_by_thread.empty()) return s;
  const uint64_t main = std::max_element(step_time_by_thread.begin(), step_time_by_thread.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  std::vector<std::pair<int64_t, int64_t>> steps;
  for (const auto& e : events)
    if (is_step(e) && e.thread == main) steps.push_back({e.start_ns, e.end_ns});
  const int64_t window = union_ns(steps);
  s.window_s = double(window) * 1e-9;
  auto inside = [&](int64_t t) {
    for (const auto& [a, b] : steps)
      if (t >= a && t < b) return true;
    return false;
  };

  // Host: own time of each op on the steps' thread, by its category or its nearest enclosing
  // op's. Events sorted by start (outer first when two start together).
  std::vector<const ProfiledEvent*> host;
  for (const auto& e : events)
    if (!e.device && e.thread == main && e.end_ns > e.start_ns && inside(e.start_ns)) host.push_back(&e);
  std::sort(host.begin(), host.end(), [](const ProfiledEvent* a, const ProfiledEvent* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
  });
  struct Open {
    const ProfiledEvent* e;
    std::string category;  // its own or inherited ("" for an annotation outside any op)
    int64_t children = 0;  // ns covered by its direct children
  };
  std::vector<Open> stack;
  std::map<std::string, double> host_ns;
  auto close = [&] {
    const Open o = stack.back();
    stack.pop_back();
    const int64_t own = std::max<int64_t>(0, (o.e->end_ns - o.e->start_ns) - o.children);
    host_ns[o.category.empty() ? "idle" : o.category] += double(own);
    if (!stack.empty()) stack.back().children += o.e->end_ns - o.e->start_ns;
  };
  int64_t top_ns = 0;  // covered by outermost events
  for (const ProfiledEvent* e : host) {
    while (!stack.empty() && stack.back().e->end_ns <= e->start_ns) close();
    std::string category = profile_category(e->name, false);
    const std::string outer = stack.empty() ? "" : stack.back().category;
    // Inside a matmul, attention or a wait everything is that; an annotation takes its parent's.
    if (outer == "matmul" || outer == "attention" || outer == "communication" || category.empty()) category = outer;
    if (stack.empty()) top_ns += e->end_ns - e->start_ns;
    stack.push_back({e, category, 0});
  }
  while (!stack.empty()) close();
  // Time of the steps outside every event (none in practice: each step is an annotation).
  host_ns["idle"] += double(std::max<int64_t>(0, window - top_ns));
  for (const char* c : kCategories) s.host_s[c] = host_ns[c] * 1e-9;

  // Device: kernels by category, idle where none runs.
  std::vector<std::pair<int64_t, int64_t>> busy;
  std::map<std::string, double> device_ns;
  for (const auto& e : events) {
    if (!e.device || e.end_ns <= e.start_ns) continue;
    const int64_t a = std::max(e.start_ns, steps.front().first), b = std::min(e.end_ns, steps.back().second);
    if (b <= a) continue;
    device_ns[profile_category(e.name, true)] += double(b - a);
    busy.push_back({a, b});
  }
  if (!busy.empty()) {
    device_ns["idle"] = double(std::max<int64_t>(0, window - union_ns(busy)));
    for (const char* c : kCategories) s.device_s[c] = device_ns[c] * 1e-9;
  }
  return s;
}

std::string ProfileSummary::format(bool device) const {
  const auto& m = device ? device_s : host_s;
  std::string out;
  char buf[96];
  for (const char* c : kCategories) {
    const auto it = m.find(c);
    const double v = it == m.end() ? 0 : it->second;
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", out.empty() ? "" : ", ", c, window_s > 0 ? 100 * v / window_s : 0);
    out += buf;
  }
  return out;
}

KinetoProfile::KinetoProfile(bool cuda, bool memory) {
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/false, memory);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda) activities.insert(impl::ActivityType::CUDA);
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    fail("train.profile_steps: LibTorch's profiler did not start (", e.what(),
         "); set train.profile_steps = 0, or use train.trace_steps for a host-only trace");
  }
  trace::set_annotating(true);
  running_ = true;
}

KinetoProfile::~KinetoProfile() {
  if (!running_) return;
  trace::set_annotating(false);
  try {
    prof::disableProfiler();
  } catch (...) {
  }
}

ProfileSummary KinetoProfile::stop(const std::string& trace_path) {
  VIDIT_CHECK(running_, "KinetoProfile::stop: not running");
  trace::set_annotating(false);
  running_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  const std::filesystem::path p(trace_path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  result->save(trace_path);
  std::vector<ProfiledEvent> events;
  events.reserve(result->events().size());
  for (const auto& e : result->events()) {
    if (e.isHiddenEvent()) continue;
    ProfiledEvent pe;
    pe.name = e.name();
    pe.device = e.deviceType() == c10::DeviceType::CUDA;
    pe.thread = e.startThreadId();
    pe.start_ns = int64_t(e.startNs());
    pe.end_ns = int64_t(e.endNs());
    events.push_back(std::move(pe));
  }
  return summarize_profile(events);
}

std::string profile_summary_json(const ProfileSummary& s, int64_t first_step, int64_t last_step) {
  nlohmann::json j{{"first_step", first_step}, {"last_step", last_step}, {"window_s", s.window_s},
                   {"events", s.events}, {"host_s", s.host_s}};
  if (s.has_device()) j["device_s"] = s.device_s;
  return j.dump(2);
}

}  // namespace vidit
