// Progress lines on a fake clock: plain lines at the interval with the right counts, rate and
// time left, a final line; in place redraws at most every redraw_seconds on a terminal; a note
// made at print time; the JSON snapshot round trip and the sum of several, as prepare's workers
// use them.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace vidit {
namespace {

// Everything written to a FILE*, read back.
class Captured {
 public:
  Captured() : f_(open_memstream(&buf_, &size_)) {}
  ~Captured() {
    std::fclose(f_);
    std::free(buf_);
  }
  std::FILE* file() { return f_; }
  std::string text() {
    std::fflush(f_);
    return std::string(buf_, size_);
  }
  std::vector<std::string> lines() {
    std::vector<std::string> out;
    std::string t = text(), cur;
    for (char c : t)
      if (c == '\n')
        out.push_back(cur), cur.clear();
      else
        cur += c;
    return out;
  }

 private:
  char* buf_ = nullptr;
  size_t size_ = 0;
  std::FILE* f_;
};

TEST(Progress, PlainLinesAtTheIntervalThenAFinalLine) {
  Captured out;
  double now = 100;
  Progress::Options o;
  o.label = "prepare";
  o.unit = "video";
  o.total = 10;
  o.out = out.file();  // a memory stream is no terminal: plain lines
  o.plain_seconds = 10;
  o.clock = [&] { return now; };
  Progress p(o);
  EXPECT_FALSE(p.terminal());
  p.count("clips", 0);
  // Two already cached at once, then one video every 4 s: a line at 12 s and at 24 s.
  p.skip(2);
  for (int i = 0; i < 8; ++i) {
    now += 4;
    if (i == 2) p.count("rejected/decode");
    else if (i == 5) p.count("rejected/bucket");
    else p.count("clips");
    p.advance();
  }
  p.finish();
  p.advance();  // after finish: nothing more
  const auto lines = out.lines();
  ASSERT_EQ(lines.size(), 3u) << out.text();
  // At 12 s: 5 done (2 skipped + 3 worked), 3/12 = 0.25 videos/s -> 4.0 s/video, 5 left -> 20 s.
  EXPECT_EQ(lines[0], "[prepare] 5/10 videos 50% | clips 2, rejected 1 (decode 1) | 4.0 s/video | 12s elapsed, 20s left");
  // At 24 s: 8 done, 6 worked: 0.25/s, 2 left -> 8 s.
  EXPECT_EQ(lines[1], "[prepare] 8/10 videos 80% | clips 4, rejected 2 (decode 1, bucket 1) | 4.0 s/video | 24s elapsed, 8s left");
  // The last video came at 32 s, before the next line was due (34 s): only the final line, once.
  EXPECT_EQ(lines[2], "[prepare] 10/10 videos 100% | clips 6, rejected 2 (decode 1, bucket 1) | 4.0 s/video | took 32s");
}

TEST(Progress, FinalLineAndSnapshot) {
  Captured out;
  double now = 0;
  Progress::Options o;
  o.label = "sample";
  o.unit = "step";
  o.total = 50;
  o.out = out.file();
  o.plain_seconds = 1000;
  o.clock = [&] { return now; };
  Progress p(o);
  for (int i = 0; i < 20; ++i) now += 0.5, p.advance();
  const ProgressSnapshot s = p.snapshot();
  EXPECT_EQ(s.done, 20);
  EXPECT_DOUBLE_EQ(s.elapsed, 10);
  EXPECT_DOUBLE_EQ(s.rate, 2);
  EXPECT_DOUBLE_EQ(s.seconds_left(), 15);
  EXPECT_EQ(p.line(), "[sample] 20/50 steps 40% | 2.00 steps/s | 10s elapsed, 15s left");
  EXPECT_EQ(out.text(), "") << "nothing before the interval";
  p.finish();
  EXPECT_EQ(out.text(), "[sample] 20/50 steps 40% | 2.00 steps/s | took 10s\n");
}

TEST(Progress, TheNoteIsMadeFromTheNumbersAtPrintTime) {
  Captured out;
  double now = 0;
  Progress::Options o;
  o.label = "prepare";
  o.unit = "video";
  o.out = out.file();
  o.plain_seconds = 0;
  o.clock = [&] { return now; };
  Progress p(o);
  p.set_note([](const ProgressSnapshot& mine) { return mine.done < 2 ? "" : "all: " + std::to_string(mine.done + 10); });
  now = 1, p.advance();
  now = 2, p.advance();
  EXPECT_EQ(out.text(), "[prepare] 1 video | 1.00 videos/s | 1s elapsed\n[prepare] 2 videos | 1.00 videos/s | 2s elapsed | all: 12\n");
}

TEST(Progress, TerminalRedrawsInPlaceAFewTimesASecond) {
  Captured out;
  double now = 0;
  Progress::Options o;
  o.label = "sample";
  o.unit = "step";
  o.total = 100;
  o.out = out.file();
  o.mode = Progress::Mode::terminal;
  o.redraw_seconds = 0.25;
  o.clock = [&] { return now; };
  {
    Progress p(o);
    for (int i = 0; i < 100; ++i) now += 0.01, p.advance();  // 1 s: the first step, then every 0.25 s
    p.finish();
  }
  const std::string t = out.text();
  size_t redraws = 0;
  for (char c : t) redraws += c == '\r';
  EXPECT_GE(redraws, 4u);
  EXPECT_LE(redraws, 6u) << t;
  EXPECT_EQ(t.find('\n'), t.size() - 1) << "one line, ended at finish: " << t;
  EXPECT_NE(t.find("\r[sample] 100/100 steps 100% | 100.00 steps/s | took 1s\033[K\n"), std::string::npos) << t;
}

TEST(Progress, AnOpenTerminalLineIsEndedWhenTheLoopThrows) {
  Captured out;
  Progress::Options o;
  o.out = out.file();
  o.mode = Progress::Mode::terminal;
  try {
    Progress p(o);
    p.advance();
    throw std::runtime_error("decode failed");
  } catch (const std::runtime_error&) {
  }
  const std::string t = out.text();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back(), '\n');
}

TEST(Progress, NoOutputCountsQuietly) {
  Progress::Options o;
  o.out = nullptr;
  o.total = 3;
  Progress p(o);
  p.count("clips");
  p.advance(3);
  p.finish();
  EXPECT_EQ(p.snapshot().done, 3);
  EXPECT_EQ(p.snapshot().counter("clips"), 1);
}

TEST(Progress, SnapshotsRoundTripAndSum) {
  ProgressSnapshot a;
  a.total = 10, a.done = 4, a.skipped = 1, a.elapsed = 6, a.rate = 0.5;
  a.counters = {{"clips", 3}, {"rejected/decode", 1}};
  ProgressSnapshot b = ProgressSnapshot::from_json(nlohmann::json::parse(a.to_json().dump()));
  EXPECT_EQ(b.to_json(), a.to_json());
  b.elapsed = 8, b.rate = 1.5;
  b.counters = {{"rejected/bucket", 2}, {"clips", 1}};
  const ProgressSnapshot s = sum_progress({a, b});
  EXPECT_EQ(s.total, 20);
  EXPECT_EQ(s.done, 8);
  EXPECT_DOUBLE_EQ(s.elapsed, 8);
  EXPECT_DOUBLE_EQ(s.rate, 2);
  EXPECT_DOUBLE_EQ(s.seconds_left(), 6);
  EXPECT_EQ(describe_progress(s, "video"),
            "8/20 videos 40% | clips 4, rejected 3 (decode 1, bucket 2) | 2.00 videos/s | 8s elapsed, 6s left");
  EXPECT_EQ(ProgressSnapshot{}.seconds_left(), -1) << "no total: unknown";
}

TEST(Progress, Durations) {
  EXPECT_EQ(short_duration(0), "0s");
  EXPECT_EQ(short_duration(59.4), "59s");
  EXPECT_EQ(short_duration(365), "6m05s");
  EXPECT_EQ(short_duration(7380), "2h03m");
  EXPECT_EQ(short_duration(3 * 86400 + 4 * 3600 + 10), "3d04h");
  EXPECT_EQ(short_duration(-1), "?");
}

}  // namespace
}  // namespace vidit
