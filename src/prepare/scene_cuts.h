// Hard scene cuts in decoded video frames, found from luma histograms.
//
// Each frame's luma (BT.601: Y = (77 R + 150 G + 29 B) / 256) is counted into kSceneBins bins on a
// sparse grid of pixels (every kSceneStride-th row and column: a cut changes the whole picture, so
// a sample of it is enough, and 1080p costs about as much as a thumbnail) and normalised to sum 1.
// Binning is soft (each pixel shared by the two nearest bin centres), so a slow fade or a flat
// picture brightening by a few levels moves a little mass, not a whole bin's. Luma alone cannot
// tell apart two scenes of the same brightness (red and dark green): such a cut is missed.
// The distance between consecutive frames is the total variation distance of their histograms,
// 0.5 * sum |p - q|, in [0, 1]: 0 for the same brightness distribution, 1 for disjoint ones (black
// to white). A cut is a frame whose distance to the frame before exceeds the threshold; the new
// scene starts at that frame. Motion, pans and slow fades move a histogram little and are no cut.
//
// Strobes, flashes and flicker can look like a cut on every frame. A detector that has found more
// than kDenseCutsMin cuts and more than one cut per kDenseCutFrames frames seen stops believing
// itself: it reports `dense`, keeps the cuts found so far and finds no more, so the rest of the
// video is one scene (prepare says so in a counted warning naming the video). Cut counts and so
// clip counts stay bounded either way.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace vidit {

constexpr int kSceneBins = 32;
constexpr int64_t kSceneStride = 4;
constexpr int64_t kDenseCutsMin = 8;
constexpr int64_t kDenseCutFrames = 4;

// Normalised luma histogram of one frame [H, W, 3] uint8 (any strides): kSceneBins floats summing to 1.
std::vector<float> luma_histogram(const at::Tensor& frame);

// Total variation distance of two histograms of the same size: 0.5 * sum |a - b|, in [0, 1].
double histogram_distance(const std::vector<float>& a, const std::vector<float>& b);

// Frames fed in order, one at a time (a decoder's callback), so a long video needs no memory but
// the previous frame's histogram. Not thread-safe.
class SceneCutDetector {
 public:
  // threshold in [0, 1]: a cut is a distance greater than this.
  explicit SceneCutDetector(double threshold);

  // The next frame [H, W, 3] uint8. True when it starts a new scene (never for the first frame,
  // nor once the detector has gone `dense`).
  bool add(const at::Tensor& frame);

  int64_t frames() const { return frames_; }
  // Indices of the frames that start a new scene, ascending.
  const std::vector<int64_t>& cuts() const { return cuts_; }
  // Cuts came too thick to be scene changes (see the header); no more are reported.
  bool dense() const { return dense_; }
  // The distance of the latest frame to the one before (0 for the first).
  double last_distance() const { return last_distance_; }

 private:
  double threshold_;
  std::vector<float> previous_;
  std::vector<int64_t> cuts_;
  int64_t frames_ = 0;
  bool dense_ = false;
  double last_distance_ = 0;
};

struct SceneCuts {
  std::vector<int64_t> cuts;  // frame indices that start a new scene, ascending
  bool dense = false;         // the detector gave up (see the header)
};

// The detector run over frames [T, H, W, 3] uint8.
SceneCuts find_scene_cuts(const at::Tensor& frames, double threshold);

}  // namespace vidit
