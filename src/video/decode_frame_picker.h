// Which decoded frames form a clip, and how many times each is output. Decided from presentation
// timestamps alone, never from frame counts, so constant and variable frame rate input are
// handled alike. Pure integer logic with no FFmpeg types: decode_video feeds it one timestamp per
// decoded frame; decode_frame_picker_test.cpp checks it against a brute-force definition.
//
// Time is in integer ticks of the stream's time base (time_base seconds per tick). The clip
// window is [begin, end) in ticks; `origin` is the clip start the output grid counts from (equal
// to begin, except that a clip without a start keeps every frame, begin = INT64_MIN, while its
// grid starts at the file's start time).
//
// Native rate (fps.num == 0): every frame with begin <= pts < end is output once.
//
// Resampled to F = fps.num / fps.den frames per second (sample and hold): output slot k stands for
// time origin + k / F and shows the latest kept frame with pts <= origin + k / F, i.e. the frame
// on screen at that time. Slots run from the first kept frame's slot, ceil((pts0 - origin) * F),
// up to but not including ceil((stop - origin) * F), where stop is the earlier of `end` and the
// end of the last frame (its pts + duration). A frame that no slot lands on is dropped; one that spans
// several slots is repeated. Arithmetic is exact (128-bit integers), so a frame at exactly
// start + k / F is the one shown at slot k.
//
// This is the ffmpeg CLI's `-ss START -i FILE -vf fps=F:round=up` (checked frame by frame in
// video_decoder_test.cpp): -ss's trim drops frames before START; the fps filter rounds each frame's
// time up to a slot and, for every slot from the first frame's on, outputs the last frame whose
// rounded slot is <= it, until the end-of-stream time. The fps filter's default, round=near, would
// instead show the frame on screen half a slot later (at start + (k + 1/2) / F); round=up is the
// rule that never shows a frame before its time.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

namespace vidit {

class FramePicker {
 public:
  struct Rational {
    int64_t num = 0;
    int64_t den = 1;
  };
  // `copies` outputs of one frame, for slots first_slot, first_slot + 1, ... (slots are only
  // meaningful when resampling).
  struct Run {
    int64_t copies = 0;
    int64_t first_slot = 0;
  };
  // What to do when a frame arrives.
  struct Step {
    Run held;           // output the frame held from an earlier step this many times, now
    int64_t now = 0;    // output this frame this many times now (native rate: 0 or 1)
    bool hold = false;  // keep this frame: a later step (or finish) says how often to output it;
                        // it replaces the frame held before, which is no longer needed
    bool done = false;  // the clip is complete: decode no further
  };

  static constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();

  // time_base > 0; end > begin (kNoEnd: none); fps.num == 0 (native) or fps > 0;
  // max_frames == -1 (no limit) or > 0. The caller validates; the picker assumes.
  FramePicker(Rational time_base, int64_t origin, int64_t begin, int64_t end, Rational fps,
              int64_t max_frames)
      : tb_(time_base), origin_(origin), begin_(begin), end_(end), fps_(fps), max_(max_frames) {}

  bool resampling() const { return fps_.num > 0; }
  bool done() const { return done_; }
  int64_t output_count() const { return count_; }

  // A decoded frame with presentation timestamp `pts`, in presentation order.
  Step on_frame(int64_t pts) {
    Step s;
    if (done_ || pts < begin_) {  // before the clip (or after it is complete): drop
      s.done = done_;
      return s;
    }
    if (pts >= end_) {  // the first frame past the window ends the clip
      if (holding_) s.held = take(slot(end_));
      done_ = true;
      s.done = true;
      return s;
    }
    if (!resampling()) {
      s.now = 1;
      ++count_;
      if (max_ > 0 && count_ >= max_) done_ = true;
      s.done = done_;
      return s;
    }
    const int64_t k = slot(pts);
    if (!holding_) {
      next_ = k;  // the grid starts at the first kept frame's slot
      holding_ = true;
    } else {
      s.held = take(k);
    }
    s.hold = !done_;
    s.done = done_;
    return s;
  }

  // End of stream; `stop` = pts + duration of the last frame passed in. How often to output the
  // held frame (none when not resampling or nothing is held).
  Run finish(int64_t stop) {
    if (done_ || !holding_) return {};
    Run r = take(slot(std::min(stop, end_)));
    done_ = true;
    return r;
  }

  // Seconds (from tick 0) of resampled slot k.
  double slot_seconds(int64_t k) const {
    return static_cast<double>(origin_) * tb_.num / tb_.den +
           static_cast<double>(k) * fps_.den / fps_.num;
  }

 private:
  // ceil((t - origin) * F) with t in ticks: (t - origin) * tb.num * fps.num / (tb.den * fps.den).
  int64_t slot(int64_t t) const {
    const __int128 a = (static_cast<__int128>(t) - origin_) * tb_.num * fps_.num;
    const __int128 b = static_cast<__int128>(tb_.den) * fps_.den;
    __int128 q = a / b;
    if (a % b != 0 && a > 0) ++q;  // division truncates toward zero: round positives up
    return static_cast<int64_t>(q);
  }

  // Outputs the held frame for slots [next_, limit), within max_frames.
  Run take(int64_t limit) {
    Run r{std::max<int64_t>(0, limit - next_), next_};
    if (max_ > 0) r.copies = std::min(r.copies, max_ - count_);
    next_ += r.copies;
    count_ += r.copies;
    if (max_ > 0 && count_ >= max_) done_ = true;
    return r;
  }

  Rational tb_;
  int64_t origin_, begin_, end_;
  Rational fps_;
  int64_t max_;
  bool holding_ = false;
  bool done_ = false;
  int64_t next_ = 0;   // the next slot to fill
  int64_t count_ = 0;  // frames output so far
};

}  // namespace vidit
