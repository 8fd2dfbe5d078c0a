// Progress of a long loop, for people watching it: done / total, named counters, rate, time left.
//
// On a terminal the status is one line, redrawn in place (\r) at most a few times a second and
// cut to the terminal's width. Anywhere else (a log file, a pipe) it is a plain line every
// `plain_seconds`, so a log stays readable; finish() prints a last line either way. A line:
//   [prepare] 120/1000 videos 12% | clips 100, rejected 10 (decode 7, bucket 3) | 2.40 videos/s | 50s, 6m05s left
//
// A snapshot of the numbers (ProgressSnapshot) can be written as JSON and several summed, which
// is how one process shows the totals of many (prepare's workers, each with a file of its own).
//
// Lines are only printed from the calling thread, inside advance() / skip() / tick() / finish():
// a loop whose single item takes minutes updates once per item. Not thread safe.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace vidit {

// The numbers of one Progress at one time.
struct ProgressSnapshot {
  int64_t total = 0;    // items to do; 0 when unknown
  int64_t done = 0;     // items done, skipped ones included
  int64_t skipped = 0;  // items done without work (e.g. found already cached): left out of the rate
  double elapsed = 0;   // seconds since the start
  double rate = 0;      // worked items per second: (done - skipped) / elapsed; 0 before any
  // Named counts in the order first counted. "group/part" names are shown as the group's sum
  // with the parts beside it: "rejected 3 (decode 2, bucket 1)".
  std::vector<std::pair<std::string, int64_t>> counters;

  int64_t counter(const std::string& name) const;  // 0 when never counted
  // Seconds left at the current rate; negative when unknown (no total or no rate yet).
  double seconds_left() const;

  nlohmann::json to_json() const;
  static ProgressSnapshot from_json(const nlohmann::json& j);  // throws nlohmann's errors on a bad shape
};

// The sum of several snapshots (totals, counts and rates added; elapsed the longest). Counters
// keep the order in which the parts first name them.
ProgressSnapshot sum_progress(const std::vector<ProgressSnapshot>& parts);

// "120/1000 videos 12% | clips 100, rejected 10 (decode 7, bucket 3) | 2.40 videos/s | 50s, 6m05s left".
// `unit` is singular ("video"); counts get an "s". finished: "took 6m57s" instead of the time left.
std::string describe_progress(const ProgressSnapshot& s, const std::string& unit, bool finished = false);

// 45s, 6m05s, 2h03m, 3d04h.
std::string short_duration(double seconds);

class Progress {
 public:
  // Seconds on a monotonic clock; tests inject a fake one.
  using Clock = std::function<double()>;
  enum class Mode {
    automatic,  // terminal when `out` is one (isatty), plain otherwise
    terminal,   // redraw one line in place
    plain,      // a line every plain_seconds
  };
  struct Options {
    std::string label;            // shown first, in brackets: "[prepare]"
    std::string unit = "item";    // singular
    int64_t total = 0;            // 0: unknown (no percentage, no time left)
    std::FILE* out = stdout;      // not owned; nullptr: count but print nothing
    Mode mode = Mode::automatic;
    double redraw_seconds = 0.25;  // terminal: at most one redraw per this
    // plain: one line per this (0: every update). The environment variable
    // VIDIT_PROGRESS_SECONDS sets the default, else 10 s.
    double plain_seconds = default_plain_seconds();
    Clock clock;  // empty: std::chrono::steady_clock
  };

  explicit Progress(Options opt);
  // Ends a line left open on a terminal (an exception went through the loop); prints no more.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // n more items done with work; prints when a line is due. Count an item's counters first.
  void advance(int64_t n = 1);
  // n more items done without work (left out of the rate); prints when a line is due.
  void skip(int64_t n = 1);
  // Adds n to a named counter ("group/part" names group, see ProgressSnapshot). Prints nothing.
  void count(const std::string& name, int64_t n = 1);
  void set_total(int64_t total) { total_ = total; }
  // Text shown after the numbers, made when a line is printed from this Progress's numbers then
  // (e.g. the totals of this and other processes); returning "" shows none.
  using Note = std::function<std::string(const ProgressSnapshot& mine)>;
  void set_note(Note note) { note_ = std::move(note); }
  // Prints a line if one is due.
  void tick();
  // The last line (with a newline); later calls do nothing.
  void finish();

  ProgressSnapshot snapshot() const;
  std::string line(bool finished = false) const;  // "[label] " + describe_progress + " | " + note
  double elapsed() const { return now() - start_; }
  bool terminal() const { return mode_ == Mode::terminal; }
  bool finished() const { return finished_; }

  static double default_plain_seconds();

 private:
  double now() const;
  void print(bool final_line);

  Options opt_;
  Mode mode_;
  double start_ = 0, last_print_ = 0;
  bool printed_ = false, open_line_ = false, finished_ = false;
  int64_t total_ = 0, done_ = 0, skipped_ = 0;
  std::vector<std::pair<std::string, int64_t>> counters_;
  Note note_;
};

}  // namespace vidit
