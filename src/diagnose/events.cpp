#include "diagnose/events.h"

#include <ctime>
#include <filesystem>

namespace vidit {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

EventLog::EventLog(const std::string& out_dir) {
  if (out_dir.empty()) return;
  std::filesystem::create_directories(out_dir);
  path_ = out_dir + "/events.jsonl";
  out_.open(path_, std::ios::app);
}

void EventLog::write(const std::string& event, int64_t step, nlohmann::json fields) {
  if (!out_.is_open() && !forward_) return;
  nlohmann::json line = {{"event", event}, {"step", step}, {"time", utc_now()}};
  for (auto& [k, v] : fields.items()) line[k] = v;
  append(line);
}

void EventLog::append(const nlohmann::json& line) {
  if (forward_) return forward_(line);
  std::lock_guard<std::mutex> lock(mu_);
  if (!out_.is_open()) return;
  out_ << line.dump() << '\n';
  out_.flush();
}

std::vector<nlohmann::json> read_events(const std::string& out_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(out_dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace vidit
