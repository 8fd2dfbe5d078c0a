#include "loader/buckets.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace vidit {

std::string Bucket::name() const {
  return std::to_string(frames) + "x" + std::to_string(height) + "x" + std::to_string(width);
}

std::vector<Bucket> make_buckets(const BucketSpec& s) {
  VIDIT_CHECK(!s.resolutions.empty(), "buckets.resolutions is empty: list at least one tier, e.g. [256]");
  VIDIT_CHECK(!s.aspect_ratios.empty(), "buckets.aspect_ratios is empty: list at least one, e.g. [1.0]");
  VIDIT_CHECK(!s.frames.empty(), "buckets.frames is empty: list at least one frame count, e.g. [17]");
  VIDIT_CHECK(s.multiple > 0, "buckets.multiple must be positive (got ", s.multiple, ")");
  VIDIT_CHECK(s.frame_stride > 0, "buckets.frame_stride must be positive (got ", s.frame_stride, ")");
  VIDIT_CHECK(s.max_upscale >= 1.0, "buckets.max_upscale must be >= 1 (got ", s.max_upscale, ")");
  for (int64_t r : s.resolutions)
    VIDIT_CHECK(r >= s.multiple, "buckets.resolutions: ", r, " is smaller than buckets.multiple (", s.multiple, ")");
  for (double a : s.aspect_ratios)
    VIDIT_CHECK(a > 0 && std::isfinite(a), "buckets.aspect_ratios: ", a, " is not a positive width/height ratio");
  for (int64_t f : s.frames)
    VIDIT_CHECK(f > 0 && (f - 1) % s.frame_stride == 0, "buckets.frames: ", f, " is not ", s.frame_stride,
                "k+1 (the VAE compresses time by ", s.frame_stride, " after the first frame); use e.g. ",
                ((std::max<int64_t>(f, 1) - 1) / s.frame_stride) * s.frame_stride + 1);
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  std::vector<Bucket> out;
  for (int64_t r : s.resolutions)
    for (double a : s.aspect_ratios) {
      const double area = double(r) * double(r);
      auto snap = [&](double v) { return std::max<int64_t>(s.multiple, std::llround(v / double(s.multiple)) * s.multiple); };
      const int64_t h = snap(std::sqrt(area / a)), w = snap(std::sqrt(area * a));
      for (int64_t f : s.frames)
        if (seen.emplace(h, w, f).second) out.push_back({f, h, w, a});
    }
  std::sort(out.begin(), out.end(), [](const Bucket& x, const Bucket& y) {
    return std::tie(x.height, x.width, x.frames) < std::tie(y.height, y.width, y.frames);
  });
  return out;
}

BucketChoice assign_bucket(const std::vector<Bucket>& buckets, int64_t width, int64_t height,
                           int64_t frames, double max_upscale) {
  BucketChoice c;
  if (width <= 0 || height <= 0 || frames <= 0) {
    c.reason = "empty clip (" + std::to_string(width) + "x" + std::to_string(height) + ", " +
               std::to_string(frames) + " frames)";
    return c;
  }
  VIDIT_CHECK(!buckets.empty(), "assign_bucket: the bucket list is empty");
  for (const auto& b : buckets) VIDIT_CHECK(b.aspect > 0, "assign_bucket: bucket ", b.name(), " has no aspect ratio");
  // The nearest aspect ratio present among the buckets.
  const double aspect = std::log(double(width) / double(height));
  double best_gap = 1e300;
  for (const auto& b : buckets) best_gap = std::min(best_gap, std::abs(std::log(b.aspect) - aspect));
  int64_t min_frames = INT64_MAX;
  double min_scale = 1e300;
  const Bucket* smallest = nullptr;
  int64_t best_volume = -1;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    if (std::abs(std::abs(std::log(b.aspect) - aspect) - best_gap) > 1e-12) continue;
    const double scale = std::max(double(b.width) / double(width), double(b.height) / double(height));
    min_frames = std::min(min_frames, b.frames);
    if (scale < min_scale) min_scale = scale, smallest = &b;
    if (b.frames > frames || scale > max_upscale + 1e-9) continue;
    const int64_t volume = b.frames * b.height * b.width;
    if (volume > best_volume) best_volume = volume, c.index = int(i), c.scale = scale;
  }
  if (c.ok()) return c;
  std::ostringstream why;
  if (frames < min_frames) {
    why << "too short: " << frames << " frames, the shortest bucket of its aspect ratio needs " << min_frames;
  } else {
    why << "too small: " << width << "x" << height << " would need upscaling by " << min_scale
        << " (buckets.max_upscale " << max_upscale << ") for the smallest bucket of its aspect ratio, "
        << smallest->width << "x" << smallest->height;
  }
  c.reason = why.str();
  return c;
}

at::Tensor fit_to_bucket(const at::Tensor& frames, const Bucket& b) {
  VIDIT_CHECK(frames.dim() == 4 && frames.size(3) == 3 && frames.scalar_type() == at::kByte,
              "fit_to_bucket: expected frames [T, H, W, 3] uint8, got ", frames.sizes(), " ", frames.scalar_type());
  VIDIT_CHECK(frames.size(0) >= b.frames, "fit_to_bucket: clip has ", frames.size(0), " frames, bucket ",
              b.name(), " needs ", b.frames);
  const int64_t H = frames.size(1), W = frames.size(2);
  const double scale = std::max(double(b.width) / double(W), double(b.height) / double(H));
  // Round, but never below the bucket (floating error must not leave a row short).
  const int64_t oh = std::max(b.height, int64_t(std::llround(double(H) * scale)));
  const int64_t ow = std::max(b.width, int64_t(std::llround(double(W) * scale)));
  at::Tensor x = frames.slice(0, 0, b.frames).permute({0, 3, 1, 2}).to(at::kFloat);
  if (oh != H || ow != W) x = at::_upsample_bilinear2d_aa(x, {oh, ow}, /*align_corners=*/false);
  const int64_t top = (oh - b.height) / 2, left = (ow - b.width) / 2;
  x = x.slice(2, top, top + b.height).slice(3, left, left + b.width);
  return x.round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
}

}  // namespace vidit
