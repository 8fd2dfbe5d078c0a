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
#include <string>

#include <nlohmann/json.hpp>

namespace vidit {

class EventLog {
 public:
  // `out_dir` empty: nothing is written (ranks other than 0, tests that do not ask).
  explicit EventLog(const std::string& out_dir = "");
  void write(const std::string& event, int64_t step, nlohmann::json fields = nlohmann::json::object());
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Every event of a run directory, in order (lines that do not parse, e.g. one torn by a kill,
// are skipped).
std::vector<nlohmann::json> read_events(const std::string& out_dir);

// The current UTC time as "2026-12-01T14:46:12Z".
std::string utc_now();

}  // namespace vidit
