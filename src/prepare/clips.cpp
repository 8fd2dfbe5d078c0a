// Clip windows of a long video and the streaming cutter (see clips.h).
#include "prepare/clips.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vidit {
namespace {

// Times within this of each other are the same instant (timestamps are microsecond-exact at best).
constexpr double kEps = 1e-6;

// The first cut strictly inside (t, t + L), if any.
std::optional<double> cut_inside(const std::vector<double>& cuts, double t, double L) {
  auto it = std::upper_bound(cuts.begin(), cuts.end(), t + kEps);
  if (it != cuts.end() && *it < t + L - kEps) return *it;
  return std::nullopt;
}

}  // namespace

void check_clip_spec(const ClipSpec& s) {
  VIDIT_CHECK(std::isfinite(s.clip_seconds) && s.clip_seconds > 0, "data.clip_seconds must be > 0 to cut clips, got ",
              s.clip_seconds);
  VIDIT_CHECK(std::isfinite(s.stride_seconds) && s.stride_seconds >= 0, "data.clip_stride_seconds must be >= 0, got ",
              s.stride_seconds);
  VIDIT_CHECK(s.max_clips > 0, "data.max_clips_per_video must be > 0, got ", s.max_clips);
}

ClipGrid clip_grid(const ClipSpec& spec, double lo, double hi) {
  check_clip_spec(spec);
  const double L = spec.clip_seconds, S = spec.stride_seconds > 0 ? spec.stride_seconds : L;
  ClipGrid g{lo, S, spec.max_clips};
  if (std::isfinite(hi) && hi - lo >= L - kEps) {
    const double room = std::max(0.0, hi - lo - L);  // where starts may go: [lo, lo + room]
    const int64_t fits = int64_t(std::floor(room / S + kEps)) + 1;
    if (fits > spec.max_clips) {  // spread max_clips windows over the whole video
      if (spec.max_clips == 1) {
        g.first = lo + room / 2;
      } else {
        g.step = room / double(spec.max_clips - 1);
      }
    }
  }
  return g;
}

std::vector<ClipWindow> plan_clip_windows(const ClipGrid& grid, double L, const std::vector<double>& cuts, double hi) {
  std::vector<ClipWindow> out;
  std::optional<double> prev;
  for (int64_t k = 0; k < grid.count; ++k) {
    const double gk = grid.first + double(k) * grid.step;
    const double next = k + 1 < grid.count ? gk + grid.step : std::numeric_limits<double>::infinity();
    // Not before the previous window's end (clips that do not overlap stay apart), or S after its
    // start when they overlap by design.
    double t = prev ? std::max(gk, *prev + std::min(grid.step, L)) : gk;
    while (auto c = cut_inside(cuts, t, L)) t = *c;  // start the window at the new scene
    if (t >= next - kEps) continue;                   // no window in this cell
    if (t + L > hi + kEps) break;                     // later cells start later still
    out.push_back({t, t + L, false});
    prev = t;
  }
  return out;
}

ClipWindow longest_scene(double lo, double hi, const std::vector<double>& cuts) {
  ClipWindow best{lo, lo, true};
  double a = lo;
  auto consider = [&](double b) {
    if (b - a > best.end - best.start + kEps) best = {a, b, true};
  };
  for (double c : cuts) {
    if (c <= lo + kEps || c >= hi - kEps) continue;
    consider(c);
    a = c;
  }
  consider(hi);
  return best;
}

std::vector<ClipWindow> plan_clips(const ClipSpec& spec, double lo, double hi, const std::vector<double>& cuts) {
  VIDIT_CHECK(std::isfinite(hi) && hi > lo, "plan_clips: the video must span [lo, hi) with hi > lo, got [", lo, ", ",
              hi, ")");
  if (hi - lo < spec.clip_seconds - kEps) return {longest_scene(lo, hi, cuts)};
  return plan_clip_windows(clip_grid(spec, lo, hi), spec.clip_seconds, cuts, hi);
}

// ---------------------------------------------------------------------------------------------
ClipCutter::ClipCutter(const ClipSpec& spec, double lo, double hi_hint, bool split_scenes, double threshold,
                       int64_t max_frames)
    : spec_(spec), lo_(lo), grid_(clip_grid(spec, lo, hi_hint)), max_frames_(max_frames) {
  VIDIT_CHECK(max_frames > 0, "ClipCutter: max_frames must be > 0, got ", max_frames);
  if (split_scenes) detector_.emplace(threshold);
}

std::vector<ClipCutter::Clip> ClipCutter::add(const at::Tensor& frame, double seconds) {
  VIDIT_CHECK(!finished_, "ClipCutter::add after finish");
  ++frames_seen_;
  if (detector_ && detector_->add(frame)) cuts_.push_back(seconds);
  buffer_.push_back({seconds, frame.clone()});
  // A frame at `seconds` completes every window that ends by then (frames come in time order).
  return emit_ready(seconds);
}

std::vector<ClipCutter::Clip> ClipCutter::finish(double end_seconds) {
  VIDIT_CHECK(!finished_, "ClipCutter::finish called twice");
  finished_ = true;
  std::vector<Clip> out = emit_ready(end_seconds);
  if (emitted_ == 0 && !buffer_.empty() && end_seconds - lo_ < spec_.clip_seconds - kEps) {
    // Shorter than one clip: the whole video (or its longest scene); every frame is still held.
    out.push_back(take(longest_scene(std::min(lo_, buffer_.front().seconds), end_seconds, cuts_)));
    ++emitted_;
  }
  buffer_.clear();
  return out;
}

std::vector<ClipCutter::Clip> ClipCutter::emit_ready(double limit) {
  std::vector<Clip> out;
  // Cuts found later lie after `limit`, so they can move only windows that end after it: the
  // windows ending by `limit` are final, and the plan's emitted prefix never changes.
  const std::vector<ClipWindow> plan = plan_clip_windows(grid_, spec_.clip_seconds, cuts_);
  for (; emitted_ < int64_t(plan.size()) && plan[size_t(emitted_)].end <= limit + kEps; ++emitted_)
    out.push_back(take(plan[size_t(emitted_)]));
  // Frames before the earliest open window (whose start can only move later) are not needed,
  // unless the video may still end before lo + L and become one short clip.
  if (limit >= lo_ + spec_.clip_seconds - kEps) {
    const double keep_from =
        emitted_ < int64_t(plan.size()) ? plan[size_t(emitted_)].start : std::numeric_limits<double>::infinity();
    while (!buffer_.empty() && buffer_.front().seconds < keep_from - kEps) buffer_.pop_front();
  }
  return out;
}

ClipCutter::Clip ClipCutter::take(const ClipWindow& w) const {
  std::vector<at::Tensor> frames;
  for (const Frame& f : buffer_)
    if (f.seconds >= w.start - kEps && f.seconds < w.end - kEps && int64_t(frames.size()) < max_frames_)
      frames.push_back(f.pixels);
  Clip c{w, {}};
  if (!frames.empty()) c.frames = at::stack(frames);
  return c;
}

}  // namespace vidit
