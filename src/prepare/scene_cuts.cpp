// Luma-histogram scene cut detection (see scene_cuts.h).
#include "prepare/scene_cuts.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vidit {

std::vector<float> luma_histogram(const at::Tensor& frame) {
  VIDIT_CHECK(frame.dim() == 3 && frame.size(2) == 3 && frame.scalar_type() == at::kByte,
              "luma_histogram: a frame must be [H, W, 3] uint8, got ", frame.sizes(), " ", frame.scalar_type());
  const at::Tensor f = frame.device().is_cpu() ? frame : frame.cpu();
  const int64_t h = f.size(0), w = f.size(1), sh = f.stride(0), sw = f.stride(1), sc = f.stride(2);
  const uint8_t* p = f.data_ptr<uint8_t>();
  // Soft binning: a pixel's weight is shared by the two bins whose centres its luma lies between,
  // so a small brightness change moves a little mass rather than a whole bin's.
  std::vector<double> mass(kSceneBins, 0.0);
  int64_t n = 0;
  for (int64_t y = std::min<int64_t>(kSceneStride / 2, h - 1); y < h; y += kSceneStride)
    for (int64_t x = std::min<int64_t>(kSceneStride / 2, w - 1); x < w; x += kSceneStride) {
      const uint8_t* px = p + y * sh + x * sw;
      const int luma = (77 * px[0] + 150 * px[sc] + 29 * px[2 * sc]) >> 8;  // 0..255
      const double pos = (luma + 0.5) * kSceneBins / 256.0 - 0.5;          // in bin-centre units
      const int lower = int(std::floor(pos));
      const double up = pos - lower;
      mass[size_t(std::clamp(lower, 0, kSceneBins - 1))] += 1 - up;
      mass[size_t(std::clamp(lower + 1, 0, kSceneBins - 1))] += up;
      ++n;
    }
  std::vector<float> hist(kSceneBins, 0.f);
  for (int i = 0; i < kSceneBins; ++i) hist[size_t(i)] = n ? float(mass[size_t(i)] / double(n)) : 0.f;
  return hist;
}

double histogram_distance(const std::vector<float>& a, const std::vector<float>& b) {
  VIDIT_CHECK(a.size() == b.size(), "histogram_distance: sizes differ (", a.size(), " vs ", b.size(), ")");
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::fabs(double(a[i]) - double(b[i]));
  return 0.5 * d;
}

SceneCutDetector::SceneCutDetector(double threshold) : threshold_(threshold) {
  VIDIT_CHECK(threshold >= 0 && threshold <= 1, "scene cut threshold must be in [0, 1] (data.scene_threshold), got ",
              threshold);
}

bool SceneCutDetector::add(const at::Tensor& frame) {
  std::vector<float> hist = luma_histogram(frame);
  last_distance_ = previous_.empty() ? 0 : histogram_distance(previous_, hist);
  previous_ = std::move(hist);
  const int64_t index = frames_++;
  if (index == 0 || dense_ || !(last_distance_ > threshold_)) return false;
  cuts_.push_back(index);
  if (int64_t(cuts_.size()) > kDenseCutsMin && int64_t(cuts_.size()) * kDenseCutFrames > frames_) {
    dense_ = true;  // this cut is kept (the frames around it did change); later ones are not looked for
  }
  return true;
}

SceneCuts find_scene_cuts(const at::Tensor& frames, double threshold) {
  VIDIT_CHECK(frames.dim() == 4 && frames.size(3) == 3, "find_scene_cuts: frames must be [T, H, W, 3], got ",
              frames.sizes());
  SceneCutDetector d(threshold);
  for (int64_t t = 0; t < frames.size(0); ++t) d.add(frames[t]);
  return {d.cuts(), d.dense()};
}

}  // namespace vidit
