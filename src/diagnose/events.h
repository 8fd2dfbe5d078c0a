// The run's diagnostic record: <out_dir>/events.jsonl, one JSON object per line, appended by
// rank 0 and kept across restarts. Everything that tells why a run misbehaved goes here, so that
// `vidit doctor RUN_DIR` (diagnose/doctor.h) can tell the story afterwards: a run that started
// or resumed (with the launcher's attempt), a skipped update, replicas whose weights disagree
// (silent data corruption), a straggling rank, a failed save.
//
// Each line has "event" (its kind), "step", "time" (UTC, ISO 8601) and the event's own fields.
// Lines are flushed as they are written: a process killed right after still leaves them.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vidit {

// Where events are written. Safe to call from several threads (the watchdog's reports a hang).
class EventLog {
 public:
  using Forward = std::function<void(const nlohmann::json& line)>;
  // Appends to <out_dir>/events.jsonl; `out_dir` empty: nothing is written (ranks other than 0,
  // tests that do not ask).
  explicit EventLog(const std::string& out_dir = "");
  // Hands each line to `to` (a training run's sinks, train/metric_sinks.h).
  explicit EventLog(Forward to) : forward_(std::move(to)) {}
  void write(const std::string& event, int64_t step, nlohmann::json fields = nlohmann::json::object());
  // A line made elsewhere (it has "event", "step" and "time" already).
  void append(const nlohmann::json& line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
  Forward forward_;
  std::mutex mu_;
};

// Every event of a run directory, in order (lines that do not parse, e.g. one torn by a kill,
// are skipped).
std::vector<nlohmann::json> read_events(const std::string& out_dir);

// The current UTC time as "2026-12-01T14:46:12Z".
std::string utc_now();

}  // namespace vidit
