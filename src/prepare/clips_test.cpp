// Clip windows of a long video (clips.h): back to back, overlapping, spread over the video when
// there would be too many, moved to start at a scene cut instead of crossing it, the short-video
// rule; and ClipCutter, fed a stream of frames, cuts the same windows with the right frames.
#include "prepare/clips.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace vidit {
namespace {

std::vector<double> starts(const std::vector<ClipWindow>& w) {
  std::vector<double> out;
  for (const auto& x : w) out.push_back(x.start);
  return out;
}

void expect_starts(const std::vector<ClipWindow>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << "starts " << ::testing::PrintToString(starts(got));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].start, want[i], 1e-9) << "window " << i;
}

bool crosses(const ClipWindow& w, const std::vector<double>& cuts) {
  for (double c : cuts)
    if (c > w.start + 1e-9 && c < w.end - 1e-9) return true;
  return false;
}

TEST(Clips, BackToBackOverlappingAndWithGaps) {
  expect_starts(plan_clips({2, 0, 100}, 0, 10, {}), {0, 2, 4, 6, 8});
  expect_starts(plan_clips({2, 0, 100}, 0, 9.5, {}), {0, 2, 4, 6});  // the tail shorter than a clip is left
  expect_starts(plan_clips({2, 1, 100}, 0, 5, {}), {0, 1, 2, 3});
  expect_starts(plan_clips({2, 3, 100}, 0, 10, {}), {0, 3, 6});
  expect_starts(plan_clips({2, 0, 100}, 4, 10, {}), {4, 6, 8});  // a manifest window [4, 10)
  for (const auto& w : plan_clips({2, 1, 100}, 0, 5, {})) EXPECT_DOUBLE_EQ(w.end - w.start, 2);
}

TEST(Clips, MoreThanTheMaximumAreSpreadOverTheVideo) {
  expect_starts(plan_clips({2, 0, 3}, 0, 20, {}), {0, 9, 18});  // first at the start, last ending at the end
  expect_starts(plan_clips({2, 0, 1}, 0, 20, {}), {9});         // one: centred
  expect_starts(plan_clips({2, 0, 5}, 0, 10, {}), {0, 2, 4, 6, 8});  // exactly the maximum: unchanged
  // Length unknown in advance: the first max_clips.
  const ClipGrid g = clip_grid({2, 0, 3}, 0, std::numeric_limits<double>::infinity());
  expect_starts(plan_clip_windows(g, 2, {}), {0, 2, 4});
  EXPECT_THROW(plan_clips({0, 0, 3}, 0, 20, {}), Error);
  EXPECT_THROW(plan_clips({2, 0, 0}, 0, 20, {}), Error);
}

TEST(Clips, NoWindowCrossesASceneCut) {
  const std::vector<double> cuts{5, 14};
  const auto w = plan_clips({2, 0, 100}, 0, 24, cuts);
  // [0,2) [2,4), the 4..6 window moves to the new scene at 5, then back to back again to 14.
  expect_starts(w, {0, 2, 5, 7, 9, 11, 14, 16, 18, 20, 22});
  for (const auto& x : w) EXPECT_FALSE(crosses(x, cuts)) << x.start;
  // Overlapping clips, and cuts every 0.7 s somewhere: still none crosses.
  const std::vector<double> many{3, 3.7, 4.4, 5.1, 9.9};
  for (const auto& x : plan_clips({1.5, 0.5, 100}, 0, 15, many)) EXPECT_FALSE(crosses(x, many)) << x.start;
  // Spread windows that meet a cut move to it, within their own share of the video.
  const auto spread = plan_clips({2, 0, 3}, 0, 20, {10});
  expect_starts(spread, {0, 10, 18});
}

TEST(Clips, ScenesShorterThanAClipGiveNone) {
  std::vector<double> cuts;
  for (int i = 1; i < 10; ++i) cuts.push_back(i);  // ten 1-second scenes
  EXPECT_TRUE(plan_clips({2, 0, 100}, 0, 10, cuts).empty());
  // A cut on every frame: no window, and the count can never exceed the grid anyway.
  std::vector<double> strobe;
  for (int i = 1; i < 80; ++i) strobe.push_back(i / 8.0);
  EXPECT_TRUE(plan_clips({2, 0, 100}, 0, 10, strobe).empty());
}

TEST(Clips, AVideoShorterThanAClipIsOneClipOfItsLongestScene) {
  const auto whole = plan_clips({5, 0, 100}, 0, 3, {});
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0], (ClipWindow{0, 3, true}));
  const auto scene = plan_clips({5, 0, 100}, 0, 3, {1});
  ASSERT_EQ(scene.size(), 1u);
  EXPECT_EQ(scene[0], (ClipWindow{1, 3, true}));
}

// Solid frames whose grey level changes at the scene starts: [scene][frame][H, W, 3].
at::Tensor solid(int level) { return at::full({12, 16, 3}, level, at::kByte); }

TEST(Clips, CutterCutsTheStreamIntoThePlannedWindowsWithTheirFrames) {
  // 8 fps; scenes start at 0 (grey 30), 5 s (grey 220) and 14 s (grey 120); 24 s in all.
  const double fps = 8;
  auto level_at = [](double t) { return t < 5 ? 30 : t < 14 ? 220 : 120; };
  ClipCutter cutter({2, 0, 100}, 0, 24, /*split_scenes=*/true, 0.5, /*max_frames=*/100);
  std::vector<ClipCutter::Clip> clips;
  for (int i = 0; i < 24 * 8; ++i) {
    const double t = i / fps;
    for (auto& c : cutter.add(solid(level_at(t)), t)) clips.push_back(std::move(c));
  }
  for (auto& c : cutter.finish(24)) clips.push_back(std::move(c));
  ASSERT_EQ(cutter.cuts(), (std::vector<double>{5, 14}));
  std::vector<ClipWindow> windows;
  for (const auto& c : clips) windows.push_back(c.window);
  EXPECT_EQ(windows, plan_clips({2, 0, 100}, 0, 24, {5, 14}));
  for (const auto& c : clips) {
    ASSERT_TRUE(c.frames.defined());
    EXPECT_EQ(c.frames.size(0), 16) << "2 s at 8 fps, window at " << c.window.start;
    const int want = level_at(c.window.start);
    EXPECT_TRUE(at::equal(c.frames, solid(want).expand({16, 12, 16, 3}))) << "clip at " << c.window.start;
  }
  EXPECT_FALSE(cutter.dense_cuts());
}

TEST(Clips, CutterStopsEarlyWhenEveryClipIsCutAndKeepsAtMostMaxFrames) {
  ClipCutter cutter({1, 0, 2}, 0, 10, false, 0.5, /*max_frames=*/5);  // two windows spread: [0,1) [9,10)
  int n = 0;
  std::vector<ClipCutter::Clip> clips;
  for (int i = 0; i < 200 && !cutter.complete(); ++i, ++n)
    for (auto& c : cutter.add(solid(i), i / 8.0)) clips.push_back(std::move(c));
  for (auto& c : cutter.finish(n / 8.0)) clips.push_back(std::move(c));
  EXPECT_EQ(n, 81) << "the frame at 10 s completes the last clip; no frame after it is needed";
  ASSERT_EQ(clips.size(), 2u);
  EXPECT_DOUBLE_EQ(clips[1].window.start, 9);
  EXPECT_EQ(clips[0].frames.size(0), 5);
  EXPECT_EQ(clips[1].frames[0][0][0][0].item<int>(), 72) << "the frame at 9 s";
  EXPECT_TRUE(cutter.complete());
}

TEST(Clips, CutterGivesAShortVideoWholeAndAStrobeABoundedCount) {
  ClipCutter shorter({5, 0, 100}, 0, 3, true, 0.5, 100);
  std::vector<ClipCutter::Clip> clips;
  for (int i = 0; i < 24; ++i)
    for (auto& c : shorter.add(solid(i < 8 ? 0 : 255), i / 8.0)) clips.push_back(std::move(c));
  for (auto& c : shorter.finish(3)) clips.push_back(std::move(c));
  ASSERT_EQ(clips.size(), 1u);
  EXPECT_EQ(clips[0].window, (ClipWindow{1, 3, true})) << "the longest scene";
  EXPECT_EQ(clips[0].frames.size(0), 16);

  ClipCutter strobe({2, 0, 100}, 0, 10, true, 0.5, 100);
  int64_t n = 0;
  for (int i = 0; i < 80; ++i) n += int64_t(strobe.add(solid(i % 2 ? 255 : 0), i / 8.0).size());
  n += int64_t(strobe.finish(10).size());
  EXPECT_TRUE(strobe.dense_cuts());
  EXPECT_EQ(int64_t(strobe.cuts().size()), kDenseCutsMin + 1) << "the detector gives up, not one cut per frame";
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 5) << "no more clips than the grid has cells";
}

}  // namespace
}  // namespace vidit
