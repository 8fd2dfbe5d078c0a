// FramePicker against its definition (decode_frame_picker.h), written out by brute force, on
// hand-made and random timestamp sequences; no FFmpeg needed.
#include "video/decode_frame_picker.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace vidit {
namespace {

using Rational = FramePicker::Rational;

struct Clip {
  Rational tb{1, 1000};
  int64_t origin = 0;
  int64_t begin = std::numeric_limits<int64_t>::min();
  int64_t end = FramePicker::kNoEnd;
  Rational fps{0, 1};
  int64_t max_frames = -1;
};

// Feeds `pts` (the last frame lasting `last_duration`) through a picker; returns the source
// index of every output frame.
std::vector<int> run_picker(const Clip& c, const std::vector<int64_t>& pts, int64_t last_duration) {
  FramePicker p(c.tb, c.origin, c.begin, c.end, c.fps, c.max_frames);
  std::vector<int> out;
  int held = -1;
  bool done = false;
  for (int i = 0; i < static_cast<int>(pts.size()) && !done; ++i) {
    const FramePicker::Step s = p.on_frame(pts[i]);
    for (int64_t k = 0; k < s.held.copies; ++k) out.push_back(held);
    for (int64_t k = 0; k < s.now; ++k) out.push_back(i);
    if (s.hold) held = i;
    done = s.done;
  }
  if (!done && !pts.empty()) {
    const FramePicker::Run r = p.finish(pts.back() + last_duration);
    for (int64_t k = 0; k < r.copies; ++k) out.push_back(held);
  }
  EXPECT_EQ(p.output_count(), static_cast<int64_t>(out.size()));
  return out;
}

// The definition, by brute force with exact integer comparisons.
std::vector<int> reference(const Clip& c, const std::vector<int64_t>& pts, int64_t last_duration) {
  std::vector<int> kept;
  int64_t stop = -1;
  for (int i = 0; i < static_cast<int>(pts.size()); ++i) {
    if (pts[i] < c.begin) continue;
    if (pts[i] >= c.end) {
      stop = c.end;
      break;
    }
    kept.push_back(i);
  }
  std::vector<int> out;
  if (kept.empty()) return out;
  if (stop < 0) stop = std::min(c.end, pts.back() + last_duration);
  const auto cap = [&] {
    if (c.max_frames > 0 && static_cast<int64_t>(out.size()) > c.max_frames) out.resize(c.max_frames);
  };
  if (c.fps.num == 0) {
    out = kept;
    cap();
    return out;
  }
  // Slot k is at origin + k / F; time t is at or before it iff (t - origin) * F <= k.
  const auto scaled = [&](int64_t t) {  // (t - origin) * F in units of 1 / (tb.den * fps.den)
    return (static_cast<__int128>(t) - c.origin) * c.tb.num * c.fps.num;
  };
  const __int128 unit = static_cast<__int128>(c.tb.den) * c.fps.den;
  const auto at_or_before = [&](int64_t t, int64_t k) { return scaled(t) <= unit * k; };
  int64_t k0 = 0;  // smallest k with the first kept frame at or before slot k
  while (!at_or_before(pts[kept[0]], k0)) ++k0;
  while (at_or_before(pts[kept[0]], k0 - 1)) --k0;
  for (int64_t k = k0; scaled(stop) > unit * k; ++k) {  // slots before ceil((stop - origin) F)
    int shown = -1;
    for (int i : kept)
      if (at_or_before(pts[i], k)) shown = i;
    out.push_back(shown);
    if (c.max_frames > 0 && static_cast<int64_t>(out.size()) >= c.max_frames) break;
  }
  cap();
  return out;
}

TEST(FramePicker, MatchesTheCliFpsFilterWithRoundUp) {
  // 10 frames at 10 fps in an MP4's 1/10240 time base. The expected lists are what
  // `ffmpeg -i F -vf fps=R:round=up` output for a clip whose frame i has grey level i
  // (FFmpeg 5.1, Debian 12); video_decoder tests repeat the comparison against the live CLI.
  Clip c;
  c.tb = {1, 10240};
  std::vector<int64_t> pts;
  for (int i = 0; i < 10; ++i) pts.push_back(i * 1024);
  const std::vector<std::pair<int64_t, std::vector<int>>> cases = {
      {20, {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9}},
      {7, {0, 1, 2, 4, 5, 7, 8}},
      {3, {0, 3, 6}},
      {13, {0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9}},
      {4, {0, 2, 5, 7}},
      {10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
  };
  for (const auto& [rate, want] : cases) {
    c.fps = {rate, 1};
    EXPECT_EQ(run_picker(c, pts, 1024), want) << rate << " fps";
    EXPECT_EQ(reference(c, pts, 1024), want) << rate << " fps";
  }
}

TEST(FramePicker, NativeRateKeepsTheWindow) {
  Clip c;  // 1/1000 s ticks, frames every 40 ms
  std::vector<int64_t> pts;
  for (int i = 0; i < 20; ++i) pts.push_back(i * 40);
  c.origin = c.begin = 100;  // frames 3 (120 ms) ..
  c.end = 400;               // .. 9 (360 ms)
  EXPECT_EQ(run_picker(c, pts, 40), (std::vector<int>{3, 4, 5, 6, 7, 8, 9}));
  c.begin = c.origin = 120;  // a frame exactly at the start is in; one exactly at the end is out
  c.end = 360;
  EXPECT_EQ(run_picker(c, pts, 40), (std::vector<int>{3, 4, 5, 6, 7, 8}));
  c.max_frames = 2;
  EXPECT_EQ(run_picker(c, pts, 40), (std::vector<int>{3, 4}));
}

TEST(FramePicker, ResamplesVariableFrameRateByTime) {
  // 10 fps for a second, then 25 fps: resampled to 10 fps, slot k shows the frame on screen at
  // k / 10 s, whatever the spacing of the frames around it.
  Clip c;
  std::vector<int64_t> pts;
  for (int i = 0; i < 10; ++i) pts.push_back(i * 100);
  for (int i = 0; i < 10; ++i) pts.push_back(1000 + i * 40);
  c.fps = {10, 1};
  const std::vector<int> want = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 17};
  EXPECT_EQ(run_picker(c, pts, 40), want);
  EXPECT_EQ(reference(c, pts, 40), want);

  // Held frames are repeated; a window that starts between frames starts its grid at the start.
  c.fps = {20, 1};
  c.origin = c.begin = 950;  // first kept frame 10 at 1000 ms: slot ceil(0.05 * 20) = 1
  c.end = 1200;              // frames 10..14; slots 1..4 (1000, 1050, 1100, 1150 ms)
  EXPECT_EQ(run_picker(c, pts, 40), (std::vector<int>{10, 11, 12, 13}));
  EXPECT_EQ(reference(c, pts, 40), (std::vector<int>{10, 11, 12, 13}));

  FramePicker p(c.tb, c.origin, c.begin, c.end, c.fps, -1);
  EXPECT_DOUBLE_EQ(p.slot_seconds(3), 0.95 + 3 / 20.0);
}

TEST(FramePicker, IgnoresFramesThatGoBackInTime) {
  // A broken stream repeats a timestamp and steps back: nothing is output twice for the same
  // slot, nothing crashes, and later frames resume normally.
  Clip c;
  c.fps = {10, 1};
  const std::vector<int64_t> pts = {0, 100, 100, 50, 200, 300};
  const std::vector<int> got = run_picker(c, pts, 100);
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(got.front(), 0);
  EXPECT_EQ(got.back(), 5);
}

TEST(FramePicker, AgreesWithTheDefinitionOnRandomClips) {
  std::mt19937_64 rng(20240607);
  const Rational bases[] = {{1, 1000}, {1, 90000}, {1, 16384}, {1001, 30000}, {1, 25}};
  const Rational rates[] = {{1, 1}, {24, 1}, {30000, 1001}, {7, 2}, {60, 1}, {8, 1}};
  for (int trial = 0; trial < 3000; ++trial) {
    Clip c;
    c.tb = bases[rng() % 5];
    c.fps = trial % 4 == 0 ? Rational{0, 1} : rates[rng() % 6];
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<int64_t> pts;
    int64_t t = static_cast<int64_t>(rng() % 50);
    for (int i = 0; i < n; ++i) {
      pts.push_back(t);
      t += 1 + static_cast<int64_t>(rng() % 200);
    }
    const int64_t span = t + 1;
    if (rng() % 2) {
      c.origin = c.begin = static_cast<int64_t>(rng() % span);
    } else {
      c.origin = static_cast<int64_t>(rng() % 50);
    }
    if (rng() % 2) c.end = std::max(c.begin, int64_t{0}) + 1 + static_cast<int64_t>(rng() % span);
    if (rng() % 3 == 0) c.max_frames = 1 + static_cast<int64_t>(rng() % 10);
    const int64_t last = 1 + static_cast<int64_t>(rng() % 200);
    ASSERT_EQ(run_picker(c, pts, last), reference(c, pts, last))
        << "trial " << trial << " tb " << c.tb.num << "/" << c.tb.den << " fps " << c.fps.num
        << "/" << c.fps.den << " origin " << c.origin << " begin " << c.begin << " end " << c.end
        << " max " << c.max_frames;
  }
}

}  // namespace
}  // namespace vidit
