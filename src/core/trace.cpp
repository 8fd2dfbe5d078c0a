#include "core/trace.h"

#include <ATen/record_function.h>

#include <cstdlib>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/gpu_events.h"

namespace vidit::trace {
namespace detail {
std::atomic<bool> recording{false};

// VIDIT_NVTX=1: annotations on for the whole run, for Nsight Systems (nsys profile ...).
const bool nvtx_requested = [] {
  const char* v = std::getenv("VIDIT_NVTX");
  return v != nullptr && std::string(v) == "1";
}();

void* begin_annotation(const char* name, int64_t index) {
  const std::string full = index >= 0 ? std::string(name) + " " + std::to_string(index) : std::string(name);
  auto* rf = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (rf->isActive()) rf->before(full);
  gpu_range_push(full.c_str());
  return rf;
}

void end_annotation(void* a) {
  gpu_range_pop();
  delete static_cast<at::RecordFunction*>(a);  // ends the scope
}
std::atomic<bool> annotating{nvtx_requested};
}  // namespace detail

void set_annotating(bool on) { detail::annotating.store(on || detail::nvtx_requested); }
namespace {

struct Event {
  std::string name;
  const char* category;
  double ts, dur;
  int tid;  // -1: asynchronous
  std::vector<std::pair<const char*, double>> args;
};

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  int pid = 0;
  std::string process_name;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

const std::chrono::steady_clock::time_point kOrigin = std::chrono::steady_clock::now();

// Small per-thread numbers (0 for the first thread that records, usually the main one).
int thread_number() {
  static std::atomic<int> next{0};
  thread_local int mine = next.fetch_add(1);
  return mine;
}

void add(Event e) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  r.events.push_back(std::move(e));
}

}  // namespace

void start(int pid, const std::string& process_name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
  r.pid = pid;
  r.process_name = process_name;
  detail::recording.store(true);
}

void stop() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  detail::recording.store(false);
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - kOrigin).count();
}

void slice(const std::string& name, const char* category, double ts_us, double dur_us, Args args) {
  if (!on()) return;
  add({name, category, ts_us, dur_us, thread_number(), {args.begin(), args.end()}});
}

void async_slice(const std::string& name, const char* category, double ts_us, double dur_us, Args args) {
  if (!on()) return;
  add({name, category, ts_us, dur_us, -1, {args.begin(), args.end()}});
}

size_t write(const std::string& path) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r.pid}, {"args", {{"name", r.process_name}}}});
  uint64_t id = 0;
  for (const Event& e : r.events) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    if (e.tid >= 0) {
      events.push_back({{"ph", "X"}, {"name", e.name}, {"cat", e.category}, {"pid", r.pid}, {"tid", e.tid},
                        {"ts", e.ts}, {"dur", e.dur}, {"args", args}});
    } else {
      // A begin / end pair with a fresh id: its own row among the process's async tracks.
      const std::string sid = std::to_string(++id);
      events.push_back({{"ph", "b"}, {"name", e.name}, {"cat", e.category}, {"pid", r.pid}, {"id", sid},
                        {"ts", e.ts}, {"args", args}});
      events.push_back({{"ph", "e"}, {"name", e.name}, {"cat", e.category}, {"pid", r.pid}, {"id", sid},
                        {"ts", e.ts + e.dur}});
    }
  }
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    VIDIT_CHECK(out.good(), "trace: cannot write '", tmp, "'");
    out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    VIDIT_CHECK(out.good(), "trace: writing '", tmp, "' failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
  return r.events.size();
}

}  // namespace vidit::trace
