// How decode_video reads a clip: which time window, at what frame rate, on which device.
//
// Times are seconds from the start of the file (the container's start time, as the ffmpeg CLI's
// `-ss` counts them), resolved to microseconds, and decide everything: which frame is shown at
// which time comes from the frames' timestamps, never from counting frames, so variable-frame-rate
// input is handled the same way as constant-rate input.
//
// The output size is the coded size (display-rotated); resizing is the bucket step's job. The
// one optional geometry change is square_pixels, which undoes a non-square sample aspect ratio.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"

namespace vidit {

// Where frames are decoded. Pixels are always returned in host memory.
enum class DecodeDevice {
  kAuto,   // NVDEC when a CUDA driver, a GPU and an NVDEC decoder for the codec exist; otherwise
           // software. When no CUDA device opens (or NVDEC fails mid-stream, which is then
           // decoded again in software), the first time in a process logs one line to stderr
           // saying why; codecs without an NVDEC decoder go to software silently.
  kCpu,    // software (libavcodec), multi-threaded; bit-exact with the ffmpeg CLI
  kNvdec,  // NVDEC through FFmpeg's `cuda` hwaccel, or vidit::Error saying why it is unavailable
};

struct DecodeOptions {
  // Clip window [start_seconds, end_seconds): frames whose presentation time is before the start
  // or at/after the end are not returned. A start > 0 seeks (to the key frame before it, then
  // decodes forward), so a late clip costs about one GOP, not the whole prefix. start >= 0;
  // end > start (infinity: to the end of the stream).
  double start_seconds = 0;
  double end_seconds = std::numeric_limits<double>::infinity();
  // At most this many output frames (-1: no limit; otherwise > 0).
  int64_t max_frames = -1;
  // Output frame rate (> 0), or 0 for the stream's own frames, one output frame per decoded frame.
  // Resampling is sample-and-hold: output frame k is the source frame on screen at time
  // t0 + k / target_fps (see decode_frame_picker.h for the exact rule, which equals the CLI's
  // `fps=target_fps:round=up` filter).
  double target_fps = 0;
  // libavcodec decoder threads (0: one per core). Ignored by NVDEC.
  int threads = 0;
  DecodeDevice device = DecodeDevice::kAuto;
  // CUDA device index for NVDEC; -1: LOCAL_RANK (torchrun / srun convention) when it is set and
  // CUDA_VISIBLE_DEVICES does not already narrow the process to one GPU, else 0.
  int cuda_device = -1;
  // When the stream's sample aspect ratio is not 1:1, stretch the width (before rotation) to
  // round(W * sar) so that pixels are square, as `-vf scale=iw*sar:ih` does. Off: coded pixels.
  bool square_pixels = false;
  // Only the bytes [byte_offset, byte_offset + byte_size) of the file hold the video: a member of a
  // tar shard (prepare/webdataset.h), read in place through FFmpeg's subfile protocol, nothing
  // extracted. byte_size < 0: the whole file.
  int64_t byte_offset = 0;
  int64_t byte_size = -1;
};

inline const char* decode_device_name(DecodeDevice d) {
  switch (d) {
    case DecodeDevice::kAuto: return "auto";
    case DecodeDevice::kCpu: return "cpu";
    case DecodeDevice::kNvdec: return "nvdec";
  }
  return "?";
}

// "auto" | "cpu" | "nvdec" -> DecodeDevice; anything else throws vidit::Error naming `what`
// (a config key, say) and the accepted values.
inline DecodeDevice parse_decode_device(const std::string& text, const std::string& what = "device") {
  if (text == "auto") return DecodeDevice::kAuto;
  if (text == "cpu") return DecodeDevice::kCpu;
  if (text == "nvdec") return DecodeDevice::kNvdec;
  fail(what, " = '", text, "' is not a video decode device; use auto, cpu or nvdec");
}

}  // namespace vidit
