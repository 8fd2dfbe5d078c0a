// Cutting one long video into training clips: which time windows, and their frames.
//
// A video (or the manifest's [start, end) window of it) spanning [lo, hi) seconds gives windows
// [t, t + L) of L = data.clip_seconds each, whose starts lie on a grid (ClipGrid): lo, lo + S,
// lo + 2S, ... with S = data.clip_stride_seconds (default L: back to back; S < L overlaps them,
// S > L leaves gaps). When the grid would hold more than data.max_clips_per_video windows and
// the video's length is known, the step is widened so that exactly that many spread evenly from
// the start to the end (one: centred). When the length is not known in advance (a container
// that does not say), the first max_clips_per_video windows are taken.
//
// Scene cuts (scene_cuts.h), as times: no window crosses one. Window k starts at its grid point
// g_k, or where the previous window ended if that is later (S after the previous start when the
// step is shorter than a clip, so overlapping clips keep their spacing); if a cut falls inside it, it
// moves to start at that cut (the new scene), and again, as long as it starts before the next
// grid point g_(k+1); otherwise grid cell k gives no window. So back-to-back clips stay back to
// back after a cut, each grid cell gives at most one window (the count stays bounded), and a
// scene shorter than L gives none. Only cuts inside a window move it, so windows are final as
// soon as the decode has passed their end: ClipCutter cuts them while the video streams by.
//
// A video (or manifest window) shorter than L is one clip: the whole of it, or its longest scene
// when it has cuts; whether that is enough frames is the buckets' decision (a clip too short for
// every bucket is a counted reject naming the video). A longer video whose scenes are all shorter
// than L gives no clip (prepare rejects it, saying so).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "prepare/scene_cuts.h"

namespace vidit {

struct ClipSpec {
  double clip_seconds = 0;    // L > 0
  double stride_seconds = 0;  // S >= 0; 0: L
  int64_t max_clips = 100;    // > 0
};

struct ClipWindow {
  double start = 0, end = 0;  // [start, end) seconds from the start of the file
  bool whole = false;         // the whole (shorter than L) video or its longest scene
  bool operator==(const ClipWindow&) const = default;
};

// Candidate window starts: first + k * step for k in [0, count).
struct ClipGrid {
  double first = 0, step = 0;
  int64_t count = 0;
};

// Throws vidit::Error for L <= 0, S < 0 or max_clips <= 0 (naming the data.* keys).
void check_clip_spec(const ClipSpec& spec);

// The grid for a video spanning [lo, hi); hi = infinity when its length is unknown.
ClipGrid clip_grid(const ClipSpec& spec, double lo, double hi);

// The windows of `grid` (see the header) that end by `hi` (infinity: all), given the scene cuts
// `cuts` (seconds, ascending; a cut at t means a scene starts at t).
std::vector<ClipWindow> plan_clip_windows(const ClipGrid& grid, double clip_seconds, const std::vector<double>& cuts,
                                          double hi = std::numeric_limits<double>::infinity());

// The longest scene of [lo, hi) between the cuts (the first of equals), as a `whole` window.
ClipWindow longest_scene(double lo, double hi, const std::vector<double>& cuts);

// Everything at once: the windows of a video spanning [lo, hi) (hi finite) with these cuts,
// including the short-video rule. ClipCutter gives the same windows from a stream of frames.
std::vector<ClipWindow> plan_clips(const ClipSpec& spec, double lo, double hi, const std::vector<double>& cuts);

// Cuts a stream of decoded frames into clips with bounded memory: it keeps the frames from the
// start of the earliest window still open (and, while the video may still turn out shorter than
// L, all of them), so at most about L seconds of frames. Feed frames in time order with add(),
// then finish() at the end of the stream. Not thread-safe.
class ClipCutter {
 public:
  struct Clip {
    ClipWindow window;
    at::Tensor frames;  // [T, H, W, 3] uint8: the frames whose time is in the window, at most max_frames
  };

  // lo: where the decode starts; hi_hint: where the video (or manifest window) is expected to
  // end (infinity: unknown), which only spreads the grid; split_scenes / threshold: detect cuts
  // (scene_cuts.h) in the frames as they come; max_frames: frames kept per clip (> 0).
  ClipCutter(const ClipSpec& spec, double lo, double hi_hint, bool split_scenes, double threshold,
             int64_t max_frames);

  // A frame [H, W, 3] uint8 (copied if kept) shown at `seconds`. Returns the clips it completes.
  std::vector<Clip> add(const at::Tensor& frame, double seconds);
  // The stream ended at `end_seconds` (the end of the last frame). Returns the remaining clips.
  std::vector<Clip> finish(double end_seconds);

  // Every grid cell has given its clip: no later frame can make another (decoding may stop).
  bool complete() const { return emitted_ == grid_.count; }
  const std::vector<double>& cuts() const { return cuts_; }  // scene cuts found (seconds)
  bool dense_cuts() const { return detector_ && detector_->dense(); }
  int64_t frames_seen() const { return frames_seen_; }

 private:
  std::vector<Clip> emit_ready(double limit);
  Clip take(const ClipWindow& w) const;

  ClipSpec spec_;
  double lo_;
  ClipGrid grid_;
  int64_t max_frames_;
  std::optional<SceneCutDetector> detector_;
  std::vector<double> cuts_;
  struct Frame {
    double seconds;
    at::Tensor pixels;
  };
  std::deque<Frame> buffer_;
  int64_t emitted_ = 0;  // windows of the plan handed out (always a prefix of it)
  int64_t frames_seen_ = 0;
  bool finished_ = false;
};

}  // namespace vidit
