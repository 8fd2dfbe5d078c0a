#include "core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

namespace vidit {
namespace {

std::string plural(int64_t n, const std::string& unit) { return n == 1 ? unit : unit + "s"; }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "clips 100, rejected 10 (decode 7, bucket 3)": groups ("a/b") in the place of their first part.
std::string describe_counters(const std::vector<std::pair<std::string, int64_t>>& counters) {
  std::vector<std::string> order;  // plain names and group names, as first seen
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> parts;
  std::map<std::string, int64_t> plain;
  for (const auto& [name, n] : counters) {
    const auto slash = name.find('/');
    const std::string key = slash == std::string::npos ? name : name.substr(0, slash);
    if (std::find(order.begin(), order.end(), key) == order.end()) order.push_back(key);
    if (slash == std::string::npos)
      plain[key] += n;
    else
      parts[key].emplace_back(name.substr(slash + 1), n);
  }
  std::string out;
  for (const auto& key : order) {
    int64_t sum = plain.count(key) ? plain[key] : 0;
    for (const auto& [part, n] : parts[key]) sum += n;
    if (!out.empty()) out += ", ";
    out += key + " " + std::to_string(sum);
    if (!parts[key].empty()) {
      out += " (";
      for (size_t i = 0; i < parts[key].size(); ++i)
        out += (i ? ", " : "") + parts[key][i].first + " " + std::to_string(parts[key][i].second);
      out += ")";
    }
  }
  return out;
}

int terminal_width(std::FILE* f) {
  struct winsize ws {};
  if (f && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

}  // namespace

int64_t ProgressSnapshot::counter(const std::string& name) const {
  for (const auto& [n, v] : counters)
    if (n == name) return v;
  return 0;
}

double ProgressSnapshot::seconds_left() const {
  if (total <= 0) return -1;
  if (done >= total) return 0;
  if (rate <= 0) return -1;
  return double(total - done) / rate;
}

nlohmann::json ProgressSnapshot::to_json() const {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& [name, n] : counters) c.push_back({name, n});
  return {{"total", total}, {"done", done}, {"skipped", skipped}, {"elapsed", elapsed}, {"rate", rate}, {"counters", c}};
}

ProgressSnapshot ProgressSnapshot::from_json(const nlohmann::json& j) {
  ProgressSnapshot s;
  s.total = j.at("total").get<int64_t>();
  s.done = j.at("done").get<int64_t>();
  s.skipped = j.at("skipped").get<int64_t>();
  s.elapsed = j.at("elapsed").get<double>();
  s.rate = j.at("rate").get<double>();
  for (const auto& c : j.at("counters")) s.counters.emplace_back(c.at(0).get<std::string>(), c.at(1).get<int64_t>());
  return s;
}

ProgressSnapshot sum_progress(const std::vector<ProgressSnapshot>& parts) {
  ProgressSnapshot s;
  for (const auto& p : parts) {
    s.total += p.total;
    s.done += p.done;
    s.skipped += p.skipped;
    s.elapsed = std::max(s.elapsed, p.elapsed);
    s.rate += p.rate;
    for (const auto& [name, n] : p.counters) {
      auto it = std::find_if(s.counters.begin(), s.counters.end(), [&](const auto& c) { return c.first == name; });
      if (it == s.counters.end())
        s.counters.emplace_back(name, n);
      else
        it->second += n;
    }
  }
  return s;
}

std::string short_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = int64_t(std::llround(seconds));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
  return buf;
}

std::string describe_progress(const ProgressSnapshot& s, const std::string& unit, bool finished) {
  std::string out;
  if (s.total > 0) {
    out = std::to_string(s.done) + "/" + std::to_string(s.total) + " " + plural(s.total, unit) + " " +
          std::to_string(std::min<int64_t>(100, s.done * 100 / s.total)) + "%";
  } else {
    out = std::to_string(s.done) + " " + plural(s.done, unit);
  }
  if (!s.counters.empty()) out += " | " + describe_counters(s.counters);
  // Fast work reads best as items per second, slow work as seconds per item.
  if (s.rate > 0) out += " | " + (s.rate >= 1 ? fixed(s.rate, 2) + " " + plural(2, unit) + "/s" : fixed(1 / s.rate, 1) + " s/" + unit);
  if (finished) {
    out += " | took " + short_duration(s.elapsed);
  } else {
    out += " | " + short_duration(s.elapsed) + " elapsed";
    const double left = s.seconds_left();
    if (left >= 0) out += ", " + short_duration(left) + " left";
  }
  return out;
}

double Progress::default_plain_seconds() {
  if (const char* v = std::getenv("VIDIT_PROGRESS_SECONDS")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && s >= 0 && std::isfinite(s)) return s;
  }
  return 10;
}

Progress::Progress(Options opt) : opt_(std::move(opt)), total_(opt_.total) {
  mode_ = opt_.mode;
  if (mode_ == Mode::automatic) mode_ = opt_.out && isatty(fileno(opt_.out)) ? Mode::terminal : Mode::plain;
  start_ = last_print_ = now();
}

Progress::~Progress() {
  if (open_line_ && opt_.out) std::fputc('\n', opt_.out), std::fflush(opt_.out);
}

double Progress::now() const {
  if (opt_.clock) return opt_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Progress::advance(int64_t n) {
  done_ += n;
  tick();
}

void Progress::skip(int64_t n) {
  done_ += n;
  skipped_ += n;
  tick();
}

void Progress::count(const std::string& name, int64_t n) {
  for (auto& [k, v] : counters_)
    if (k == name) {
      v += n;
      return;
    }
  counters_.emplace_back(name, n);
}

ProgressSnapshot Progress::snapshot() const {
  ProgressSnapshot s;
  s.total = total_;
  s.done = done_;
  s.skipped = skipped_;
  s.elapsed = elapsed();
  s.rate = s.elapsed > 0 ? double(done_ - skipped_) / s.elapsed : 0;
  s.counters = counters_;
  return s;
}

std::string Progress::line(bool finished) const {
  std::string out = opt_.label.empty() ? "" : "[" + opt_.label + "] ";
  const ProgressSnapshot s = snapshot();
  out += describe_progress(s, opt_.unit, finished);
  if (note_) {
    const std::string note = note_(s);
    if (!note.empty()) out += " | " + note;
  }
  return out;
}

void Progress::tick() {
  if (finished_ || !opt_.out) return;
  const double since = now() - last_print_;
  const bool due = mode_ == Mode::terminal ? !printed_ || since >= opt_.redraw_seconds : since >= opt_.plain_seconds;
  if (due) print(false);
}

void Progress::finish() {
  if (finished_) return;
  if (opt_.out) print(true);
  finished_ = true;
}

void Progress::print(bool final_line) {
  std::string text = line(final_line);
  if (mode_ == Mode::terminal) {
    // Cut to the width, or a wrapped line would be redrawn from its last row only.
    const int width = terminal_width(opt_.out);
    if (width > 1 && int(text.size()) > width - 1) text.resize(size_t(width - 1));
    std::fprintf(opt_.out, "\r%s\033[K%s", text.c_str(), final_line ? "\n" : "");
    open_line_ = !final_line;
  } else {
    std::fprintf(opt_.out, "%s\n", text.c_str());
  }
  std::fflush(opt_.out);
  printed_ = true;
  last_print_ = now();
}

}  // namespace vidit
